#!/usr/bin/env python3
"""Packed documents through trident run and trident eval: each document's
loss does not depend on its neighbour. Four one-window validation files
hold two documents each, A|B, A|C, D|B and D|C (|A| = |D|, |B| = |C|), so
that with per-document attention loss(AB) + loss(DC) = loss(AC) + loss(DB)
(each loss is (S_first + S_second) / the same target count); the same
identity fails with packing = "none" (the test can fail). The packed
validation loss on cp = 2 (ring zig-zag and contiguous, Ulysses) equals one
rank (1e-5 relative); two packed training steps with a sliding window under
Ulysses (cp = 2) and hybrid (cp = 4, u = 2) end with the one-rank weights
(1e-4 relative); the run file records the packed-piece histogram."""
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import BIN, MPIRUN, check, checkpoint_tensors, launch, verdict

sys.path.insert(0, os.path.join(os.environ["TRIDENT_SOURCE_DIR"], "share", "trident", "examples"))
import make_megatron_data  # noqa: E402

L = 32
CONFIG = """
[model]
vocab_size = 32
d_model = 32
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_hidden = 48
n_experts = 0
init_std = 0.2

[data]
task = "tokens"
format = "megatron"
prefix = "train_text_document"
packing = "documents"
seq_len = %d
micro_batch_size = 1
num_microbatches = 2

[train]
steps = 2
lr = 1e-2
warmup_steps = 1

[eval]
steps = 1
""" % L


def trident_eval(np_, args, timeout=180):
    cmd = ([BIN] if np_ == 1 else MPIRUN + ["-np", str(np_), BIN]) + ["eval"] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    m = re.search(r"validation loss ([0-9.]+),", p.stdout)
    if not m:
        print(p.stdout, p.stderr)
    return float(m.group(1)) if m else float("nan")


def main():
    work = tempfile.mkdtemp(prefix="trident-packed-test-")
    os.chdir(work)
    rng = np.random.default_rng(5)
    doc = lambda n: rng.integers(2, 32, n).astype(np.uint16)  # noqa: E731
    a, d = doc(13), doc(13)
    b, c = doc(L + 1 - 13), doc(L + 1 - 13)
    pairs = {"ab": (a, b), "ac": (a, c), "db": (d, b), "dc": (d, c)}
    for name, docs in pairs.items():
        make_megatron_data.write("v_" + name, list(docs))
    make_megatron_data.write("train_text_document",
                             make_megatron_data.documents(300, 32, 12, seed=4))
    with open("job.toml", "w") as f:
        f.write(CONFIG)
    rc, out, err, _ = launch(1, ["job.toml", "--output", "run.h5", "--set", "output.checkpoint_dir=ck"])
    check(rc == 0, "packed training run on 1 rank (rc=%d: %s)" % (rc, err.strip()[-300:]))
    with h5py.File("run.h5", "r") as f:
        pieces = f["data/packed_lengths"][:] if "data/packed_lengths" in f else np.array([])
    check(pieces.sum() > 2 * 2 and len(pieces) >= 2,
          "/data/packed_lengths: several pieces per sequence (%r)" % list(pieces))
    ckpt = "ck/ckpt_step_%08d.h5" % 2

    def losses(extra):
        return {n: trident_eval(1, ["job.toml", "--checkpoint", ckpt, "--set",
                                    "eval.prefix=v_" + n] + extra) for n in pairs}

    packed = losses([])
    lhs, rhs = packed["ab"] + packed["dc"], packed["ac"] + packed["db"]
    check(abs(lhs - rhs) <= 1e-5 * abs(lhs),
          "packed: loss(AB) + loss(DC) = loss(AC) + loss(DB): %.7f vs %.7f" % (lhs, rhs))
    plain = losses(["--set", "data.packing=none"])
    lhs0, rhs0 = plain["ab"] + plain["dc"], plain["ac"] + plain["db"]
    check(abs(lhs0 - rhs0) > 1e-3 * abs(lhs0),
          "packing = none: the identity fails (%.7f vs %.7f), so the check bites" % (lhs0, rhs0))
    # the packed loss on the ring (cp = 2, zig-zag and contiguous) = one rank
    for layout in ("zigzag", "contiguous"):
        ring = trident_eval(2, ["job.toml", "--checkpoint", ckpt, "--set", "eval.prefix=v_ab",
                                "--set", "parallel.cp=2", "--set", "parallel.cp_layout=" + layout])
        check(abs(ring - packed["ab"]) <= 1e-5 * abs(packed["ab"]),
              "cp=2 %s packed validation %.7f = 1 rank %.7f" % (layout, ring, packed["ab"]))
    uly = trident_eval(2, ["job.toml", "--checkpoint", ckpt, "--set", "eval.prefix=v_ab",
                           "--set", "parallel.cp=2", "--set", "parallel.cp_mode=ulysses"])
    check(abs(uly - packed["ab"]) <= 1e-5 * abs(packed["ab"]),
          "cp=2 ulysses packed validation %.7f = 1 rank %.7f" % (uly, packed["ab"]))
    check_modes_train()
    return verdict()


def check_modes_train():
    """Packed training with a window (smaller than most documents) under the
    Ulysses modes ends with the one-rank weights."""
    def train(np_, tag, extra):
        rc, _, err, _ = launch(np_, ["job.toml", "--output", tag + ".h5", "--set", "model.window=9",
                                     "--set", "output.checkpoint_dir=" + tag] + extra, timeout=240)
        check(rc == 0, "%s: packed training with a window (rc=%d: %s)" % (tag, rc, err.strip()[-300:]))
        path = "%s/ckpt_step_%08d.h5" % (tag, 2)
        return checkpoint_tensors(path) if rc == 0 else {}

    one = train(1, "window1", [])
    for tag, np_, extra in (("ulysses2", 2, ["--set", "parallel.cp=2",
                                             "--set", "parallel.cp_mode=ulysses"]),
                            ("hybrid4", 4, ["--set", "parallel.cp=4", "--set", "parallel.cp_mode=hybrid",
                                            "--set", "parallel.cp_ulysses=2"])):
        got = train(np_, tag, extra)
        if not one or not got:
            continue
        worst = max(np.linalg.norm(got[n] - one[n]) / max(np.linalg.norm(one[n]), 1e-30)
                    for n in one)
        check(set(got) == set(one) and worst <= 1e-4,
              "%s: weights after 2 packed steps with a window = 1 rank (worst relative %.2e)"
              % (tag, worst))


if __name__ == "__main__":
    sys.exit(main())
