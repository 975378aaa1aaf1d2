#!/usr/bin/env python3
"""A converted Hugging Face model computes what its architecture defines:
small random LlamaForCausalLM (Llama 3 RoPE scaling; tied embeddings with
linear scaling), MixtralForCausalLM and Qwen3MoeForCausalLM models (each
also with a sliding window on every layer) written
with numpy (tests/unit/io/hf_models.py), converted with `trident convert hf`,
evaluated with `trident eval --tokens --logits-out` on 1 rank and on the
8-rank mesh (pp2 cp2 ep2 dp2, zig-zag; the dense Llama pp2 cp2 dp2, the tied model
pp1 cp2 dp4): the
logits equal an independent float64 numpy forward of the published
equations within 1e-5 relative, and the per-token losses equal the
cross-entropy of the reference logits. A context-extension run setting
model.rope_theta on the converted checkpoint is accepted and changes the
logits as the reference with that base does. Bad eval inputs exit 2
(--tokens or --logits-out alone among them)."""
import os
import shlex
import subprocess
import sys
import tempfile

import h5py
import numpy as np

SRC = os.environ["TRIDENT_SOURCE_DIR"]
sys.path.insert(0, os.path.join(SRC, "tests/unit/io"))
import hf_models as hm  # noqa: E402

BIN = os.environ["TRIDENT_BIN"]
MPIRUN = shlex.split(os.environ["TRIDENT_MPIRUN"])
S = 16  # tokens per sequence
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def evaluate(np_, cfg, ck, tokens, out, extra):
    p = subprocess.run(MPIRUN + ["-np", str(np_), BIN, "eval", cfg, "--checkpoint", ck,
                                 "--tokens", tokens, "--logits-out", out] + extra,
                       capture_output=True, text=True, timeout=300)
    return p.returncode, p.stderr


def mesh_args(np_, tied, moe=True):
    topo = ["--set", "topology.nodes=1", "--set", f"topology.devices_per_node={np_}",
            "--set", f"topology.nvlink_domain={np_}", "--set", f"data.seq_len={S}",
            "--set", "data.micro_batch_size=1", "--set", "output.timeline=false"]
    if np_ == 1:
        return topo + ["--set", "data.num_microbatches=4"]
    if tied:  # dp 4: the global batch is 4 sequences as on one rank
        return topo + ["--set", "parallel.cp=2", "--set", "data.num_microbatches=1"]
    return topo + ["--set", "parallel.pp=2", "--set", "parallel.cp=2",
                   "--set", f"parallel.ep={2 if moe else 1}", "--set", "data.num_microbatches=2"]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def main():
    rng = np.random.default_rng(27)
    with tempfile.TemporaryDirectory() as d:
        cases = [("llama", hm.config_of("llama"), False),
                 ("llama-tied", hm.config_of("llama", tied=True, scaling="linear"), True),
                 ("mixtral", hm.config_of("mixtral"), False),
                 ("qwen3moe", hm.config_of("qwen3_moe"), False),
                 ("mixtral-window5", dict(hm.config_of("mixtral"), sliding_window=5), False),
                 ("qwen3moe-window6", dict(hm.config_of("qwen3_moe"), use_sliding_window=True,
                                           sliding_window=6, max_window_layers=0), False)]
        for name, c, tied in cases:
            src, ck, toml = (os.path.join(d, name + s) for s in ("-hf", ".h5", ".toml"))
            tensors = hm.random_tensors(c, seed=len(name) + 100)
            hm.write_model(src, c, tensors)
            r = subprocess.run([BIN, "convert", "hf", src, "--out", ck, "--config-out", toml],
                               capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, f"{name}: convert hf ({r.stderr.strip()})")
            if r.returncode:
                continue
            ids = rng.integers(0, c["vocab_size"], size=4 * S + 1).astype(np.uint16)
            tok = os.path.join(d, name + "-tokens.bin")
            ids.tofile(tok)
            ref = np.stack([hm.forward(c, tensors, ids[k * S:(k + 1) * S]) for k in range(4)])
            lse = np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1)) + ref.max(-1)
            tgt = np.stack([ids[k * S + 1:(k + 1) * S + 1] for k in range(4)]).astype(np.int64)
            ref_loss = lse - np.take_along_axis(ref, tgt[..., None], -1)[..., 0]
            if hm.window_of(c, c["num_hidden_layers"] - 1):
                c0 = dict(c, sliding_window=None, use_sliding_window=False)
                ref0 = np.stack([hm.forward(c0, tensors, ids[k * S:(k + 1) * S])
                                 for k in range(4)])
                check(rel(ref, ref0) > 1e-3, f"{name}: the window changes the reference logits "
                                             f"({rel(ref, ref0):.2e})")
            for np_ in (1, 8):
                out = os.path.join(d, f"{name}-{np_}.h5")
                rc, err = evaluate(np_, toml, ck, tok, out,
                                   mesh_args(np_, tied, c["model_type"] != "llama"))
                check(rc == 0, f"{name}, {np_} rank(s): eval exits 0 {err.strip()[-300:]}")
                if rc:
                    continue
                with h5py.File(out, "r") as f:
                    got = f["logits"][()]
                    loss = f["loss"][()]
                    check(f.attrs["format"] == "trident-logits" and
                          np.array_equal(f["tokens"][()], ids[:4 * S].reshape(4, S)),
                          f"{name}, {np_} rank(s): file format and tokens")
                e = rel(got.astype(np.float64), ref)
                check(e <= 1e-5, f"{name}, {np_} rank(s): logits within 1e-5 of the numpy "
                                 f"reference (max |diff| / max |ref| = {e:.2e})")
                e = rel(loss.astype(np.float64), ref_loss)
                check(e <= 1e-5, f"{name}, {np_} rank(s): per-token losses within 1e-5 ({e:.2e})")

            if name == "llama":
                # Context extension: another RoPE base on the converted checkpoint.
                out = os.path.join(d, "llama-theta.h5")
                rc, err = evaluate(1, toml, ck, tok, out,
                                   mesh_args(1, False) + ["--set", "model.rope_theta=20000.0"])
                check(rc == 0, f"llama, rope_theta=20000 on the converted checkpoint: exit 0 "
                               f"{err.strip()[-300:]}")
                if rc == 0:
                    c2 = dict(c, rope_theta=20000.0)
                    ref2 = np.stack([hm.forward(c2, tensors, ids[k * S:(k + 1) * S])
                                     for k in range(4)])
                    got = h5py.File(out, "r")["logits"][()].astype(np.float64)
                    check(rel(got, ref2) <= 1e-5 and rel(got, ref) > 1e-3,
                          f"llama, rope_theta=20000: logits follow the new base "
                          f"({rel(got, ref2):.2e} from its reference, {rel(got, ref):.2e} "
                          f"from the old)")
                # Bad inputs: a token file of the wrong length, another model.
                short = os.path.join(d, "short.bin")
                ids[:2 * S].tofile(short)
                rc, err = evaluate(1, toml, ck, short, os.path.join(d, "x.h5"),
                                   mesh_args(1, False))
                lines = [x for x in err.splitlines() if x.startswith("trident: error")]
                check(rc == 2 and len(lines) == 1 and "--tokens" in lines[0] and
                      not os.path.exists(os.path.join(d, "x.h5")),
                      f"eval: a token file too short for the batch exits 2 ({lines})")
                rc, err = evaluate(1, toml, ck, tok, os.path.join(d, "y.h5"),
                                   mesh_args(1, False) + ["--set", "model.n_layers=3"])
                lines = [x for x in err.splitlines() if x.startswith("trident: error")]
                check(rc == 2 and len(lines) == 1 and "another model" in lines[0],
                      f"eval: a checkpoint of another model exits 2 ({lines})")
                # --tokens and --logits-out come together.
                for flags, name_ in ((["--tokens", tok], "--tokens"),
                                     (["--logits-out", os.path.join(d, "z.h5")], "--logits-out")):
                    p = subprocess.run(MPIRUN + ["-np", "1", BIN, "eval", toml, "--checkpoint", ck]
                                       + flags + mesh_args(1, False),
                                       capture_output=True, text=True, timeout=300)
                    lines = [x for x in p.stderr.splitlines() if x.startswith("trident: error")]
                    check(p.returncode == 2 and len(lines) == 1 and name_ in lines[0] and
                          not os.path.exists(os.path.join(d, "z.h5")),
                          f"eval: {name_} alone exits 2 ({lines})")
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
