#!/usr/bin/env python3
"""trident against transformers itself: every model under tests/fixtures/hf
(made and run by transformers 4 and 5, tests/fixtures/make_hf_fixtures.py)
is converted with `trident convert hf`, evaluated with `trident eval
--tokens --logits-out` on 1 rank and on a 4-rank mesh (pp2 cp2 ep2; the
dense models pp2 cp2, the tied one cp4), and its logits must equal the
logits transformers computed within 1e-5 of their largest magnitude. The
checkpoint converted back with `convert to-hf` in the fixture's dtype gives
every tensor of the fixture bit for bit (fused expert tensors compared
after stacking trident's per-expert tensors as transformers 5 fuses them;
the rotary buffers old Llama files carry are not written back). Every
config.json under tests/fixtures/hf/refused (saved by transformers' config
classes) is refused with exit 2 and one line naming its unsupported field.
For a dense and an MoE fixture, `trident eval`'s validation loss and
perplexity over two batches equal the mean cross-entropy of transformers'
logits over the same 64 targets.
No PyTorch is needed: the references are committed with the versions that
made them (each fixture.json). HF_FIXTURES_ONLY=TEXT runs the models whose
name holds TEXT (and every refusal)."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SRC = os.environ["TRIDENT_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SRC, "tests/mpi/train"))
from mpirun_cli import BIN, MPIRUN, check, verdict  # noqa: E402

FIXTURES = os.path.join(SRC, "tests/fixtures/hf")
TOL = 1e-5
# Fixtures whose validation loss is checked too (a dense and an MoE model).
VALIDATION = ("llama-v5-f32-llama3", "qwen3moe-v5-f32")
DTYPE_FLAG = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def read_file(fn, out):
    """The tensors of one safetensors file into out: name -> (dtype, shape, raw bytes)."""
    blob = open(fn, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    for name, e in header.items():
        b, end = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], blob[8 + n + b:8 + n + end])
    return out


def read_dir(d):
    """Every tensor of a model directory (one file or shards)."""
    out = {}
    for fn in sorted(glob.glob(os.path.join(d, "*.safetensors"))):
        read_file(fn, out)
    return out


def fuse_experts(tensors):
    """trident writes each expert's gate, up and down; transformers 5 holds a
    layer's experts as gate_up_proj [E, 2 f, d] (each expert's gate rows, then
    its up rows) and down_proj [E, d, f]. Stacks the former into the latter,
    byte for byte, so a fused fixture can be compared."""
    out, groups = {}, {}
    for name, t in tensors.items():
        if ".experts." not in name:
            out[name] = t
            continue
        head, tail = name.split(".experts.")
        e, kind = tail.split(".")[0], tail.split(".")[1]
        groups.setdefault(head, {}).setdefault(int(e), {})[kind] = t
    for head, experts in groups.items():
        new = head.replace("block_sparse_moe", "mlp")  # transformers 5's Mixtral name
        gate = {"w1", "gate_proj"}
        up = {"w3", "up_proj"}
        rows_gu, rows_d, dt = [], [], None
        for e in sorted(experts):
            parts = experts[e]
            g = next(v for k, v in parts.items() if k in gate)
            u = next(v for k, v in parts.items() if k in up)
            dn = next(v for k, v in parts.items() if k not in gate | up)
            dt = g[0]
            rows_gu.append(g[2] + u[2])
            rows_d.append(dn[2])
        E = len(experts)
        f, d = experts[0][next(k for k in experts[0] if k in gate)][1]
        out[new + ".experts.gate_up_proj"] = (dt, [E, 2 * f, d], b"".join(rows_gu))
        out[new + ".experts.down_proj"] = (dt, [E, d, f], b"".join(rows_d))
        gname = head + ".gate.weight"
        if gname in out and new != head:
            out[new + ".gate.weight"] = out.pop(gname)
    return out


def mesh(np_, cfg):
    topo = ["--set", "topology.nodes=1", "--set", f"topology.devices_per_node={np_}",
            "--set", f"topology.nvlink_domain={np_}", "--set", "data.seq_len=16",
            "--set", "data.micro_batch_size=1", "--set", "output.timeline=false"]
    if np_ == 1:
        return topo + ["--set", "data.num_microbatches=4"], "1 rank"
    if cfg.get("tie_word_embeddings"):  # the tied head lives on the first stage: no pp
        return topo + ["--set", "parallel.cp=4", "--set", "data.num_microbatches=4"], "cp4"
    moe = cfg["model_type"] != "llama"
    extra = ["--set", "parallel.ep=2"] if moe else []
    return (topo + ["--set", "parallel.pp=2", "--set", "parallel.cp=2",
                    "--set", "data.num_microbatches=4"] + extra,
            "pp2 cp2 ep2" if moe else "pp2 cp2")


def evaluate(np_, toml, ck, tok, out, args):
    cmd = ([BIN] if np_ == 1 else MPIRUN + ["-np", str(np_), BIN])
    p = subprocess.run(cmd + ["eval", toml, "--checkpoint", ck, "--tokens", tok,
                              "--logits-out", out] + args,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def one_fixture(d, src):
    name = os.path.basename(src)
    meta = json.load(open(os.path.join(src, "fixture.json")))
    cfg = json.load(open(os.path.join(src, "config.json")))
    ck, toml = os.path.join(d, name + ".h5"), os.path.join(d, name + ".toml")
    r = subprocess.run([BIN, "convert", "hf", src, "--out", ck, "--config-out", toml],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"{name}: convert hf exits 0 {r.stderr.strip()}")
    if r.returncode:
        return
    ref = np.load(os.path.join(src, "logits.npy")).astype(np.float64)
    tok = os.path.join(src, "tokens.bin")
    ids = np.fromfile(tok, dtype=np.uint16)
    for np_ in (1, 4):
        args, label = mesh(np_, cfg)
        out = os.path.join(d, f"{name}-{np_}.h5")
        rc, err = evaluate(np_, toml, ck, tok, out, args)
        check(rc == 0, f"{name}, {label}: eval exits 0 {err.strip()[-300:]}")
        if rc:
            continue
        with h5py.File(out, "r") as f:
            got = f["logits"][()].astype(np.float64)
            same_tokens = np.array_equal(f["tokens"][()].ravel(), ids[:got.shape[0] * 16])
        diff = float(np.max(np.abs(got - ref)))
        scale = float(np.max(np.abs(ref)))
        check(same_tokens and got.shape == ref.shape and diff <= TOL * scale,
              f"{name}, {label}: logits equal transformers {meta['transformers']}'s within "
              f"{TOL:g} of max |logit| {scale:.3f} (max |diff| {diff:.2e}, {diff / scale:.2e})")
    # Back to Hugging Face in the fixture's dtype: the same bytes.
    back = os.path.join(d, name + "-back")
    args = ["convert", "to-hf", ck, "--out", back, "--dtype", DTYPE_FLAG[meta["dtype"]]]
    if meta["sharded"]:
        args += ["--shard-size", "16000"]
    r = subprocess.run([BIN] + args, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"{name}: convert to-hf exits 0 {r.stderr.strip()}")
    if r.returncode:
        return
    a = {k: v for k, v in read_dir(src).items() if not k.endswith(".rotary_emb.inv_freq")}
    b = read_dir(back)
    if meta["fused_experts"]:
        b = fuse_experts(b)
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    check(not differ, f"{name}: convert to-hf --dtype {DTYPE_FLAG[meta['dtype']]} gives the "
                      f"fixture's {len(a)} tensors bit for bit (differ: {differ[:3]})")
    check(meta["sharded"] == os.path.exists(os.path.join(back, "model.safetensors.index.json")),
          f"{name}: sharded output as the fixture ({meta['sharded']})")
    if os.path.isdir(os.path.join(src, "casts")):
        rounded_like_torch(d, src, ck)
    if name in VALIDATION:
        validation_loss(d, src, ck, toml)


def rounded_like_torch(d, src, ck):
    """An fp32 model written as bf16 and as fp16: every value rounded as
    torch's .to(dtype) rounds it (casts/, made by torch from the fixture's
    own tensors), ties and fp16 subnormals included."""
    name = os.path.basename(src)
    for flag in ("bf16", "fp16"):
        out = os.path.join(d, f"{name}-{flag}")
        r = subprocess.run([BIN, "convert", "to-hf", ck, "--out", out, "--dtype", flag],
                           capture_output=True, text=True, timeout=120)
        want = read_file(os.path.join(src, "casts", flag + ".safetensors"), {})
        got = read_dir(out) if r.returncode == 0 else {}
        differ = sorted(k for k in want if want[k] != got.get(k))
        check(r.returncode == 0 and not differ and len(got) == len(want),
              f"{name}: convert to-hf --dtype {flag} rounds all {len(want)} tensors as torch "
              f"does (differ: {differ[:3]}) {r.stderr.strip()}")


def validation_loss(d, src, ck, toml):
    """`trident eval` without --tokens: the validation loss and perplexity
    over two batches of two sequences (eval.token_file = the fixture's
    tokens, read whole: windows 0, 16, 32, 48) against the mean
    cross-entropy of transformers' logits over the 64 targets."""
    name = os.path.basename(src)
    cfg = json.load(open(os.path.join(src, "config.json")))
    ref = np.load(os.path.join(src, "logits.npy")).astype(np.float64)
    ids = np.fromfile(os.path.join(src, "tokens.bin"), dtype=np.uint16).astype(np.int64)
    tgt = np.stack([ids[k * 16 + 1:(k + 1) * 16 + 1] for k in range(ref.shape[0])])
    top = ref.max(-1, keepdims=True)
    lse = np.log(np.exp(ref - top).sum(-1)) + top[..., 0]
    want = float(np.mean(lse - np.take_along_axis(ref, tgt[..., None], -1)[..., 0]))
    tok = os.path.join(src, "tokens.bin")
    data = ["--set", "data.task=tokens", "--set", "data.format=flat", "--set",
            f"data.token_file={tok}", "--set", "data.token_dtype=uint16", "--set",
            f"eval.token_file={tok}", "--set", "eval.steps=2"]
    for np_ in (1, 4):
        args, label = mesh(np_, cfg)
        args = [a.replace("data.num_microbatches=4", "data.num_microbatches=2") for a in args]
        cmd = ([BIN] if np_ == 1 else MPIRUN + ["-np", str(np_), BIN])
        p = subprocess.run(cmd + ["eval", toml, "--checkpoint", ck] + args + data,
                           capture_output=True, text=True, timeout=300)
        m = re.search(r"validation loss ([0-9.]+), perplexity ([0-9.]+) over (\d+) targets "
                      r"\((\d+) sequences", p.stdout)
        check(p.returncode == 0 and m is not None,
              f"{name}, {label}: eval prints the validation loss {p.stderr.strip()[-300:]}")
        if not m:
            continue
        loss, ppl, targets, seqs = float(m[1]), float(m[2]), int(m[3]), int(m[4])
        check(targets == 64 and seqs == 4 and abs(loss - want) <= 2e-6 * max(1.0, want) + 1e-6
              and abs(ppl - np.exp(want)) <= 1e-4 * np.exp(want),
              f"{name}, {label}: validation loss {loss:.6f} and perplexity {ppl:.4f} over "
              f"{targets} targets in 2 batches = transformers' {want:.6f}, {np.exp(want):.4f}")


def refused(d, src):
    name = os.path.basename(src)
    field = json.load(open(os.path.join(src, "fixture.json")))["refused_field"]
    out = os.path.join(d, "refused-" + name + ".h5")
    r = subprocess.run([BIN, "convert", "hf", src, "--out", out], capture_output=True,
                       text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    cfg_path = os.path.join(src, "config.json")
    check(r.returncode == 2 and len(lines) == 1 and cfg_path in lines[0] and field in lines[0]
          and not os.path.exists(out),
          f"refused/{name}: exit {r.returncode}, one line naming {field}: {lines}")


def main():
    models = sorted(p for p in glob.glob(os.path.join(FIXTURES, "*"))
                    if os.path.isfile(os.path.join(p, "logits.npy")))
    bad = sorted(glob.glob(os.path.join(FIXTURES, "refused", "*")))
    check(len(models) >= 13 and len(bad) >= 18,
          f"{len(models)} model fixtures and {len(bad)} refused configs found")
    only = os.environ.get("HF_FIXTURES_ONLY")
    with tempfile.TemporaryDirectory() as d:
        for src in models:
            if not only or only in os.path.basename(src):
                one_fixture(d, src)
        for src in bad:
            refused(d, src)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
