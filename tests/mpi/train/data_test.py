#!/usr/bin/env python3
"""Token data end to end: training on a Megatron-format dataset written by
share/trident/examples/make_megatron_data.py with a train/validation split
and [eval] (rows in /metrics/eval, the document-length histogram in /data),
`trident eval` of the checkpoint on 1 rank equal to the run's own validation
and to the 8-rank mesh (1e-5 relative), and bad files refused with exit 2,
one line naming the file and the byte offset, and no run file."""
import os
import re
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import BIN, MPIRUN, check, launch, verdict

sys.path.insert(0, os.path.join(os.environ["TRIDENT_SOURCE_DIR"], "share", "trident", "examples"))
import make_megatron_data  # noqa: E402

DOCS = 400
CONFIG = """
[model]
vocab_size = 32
d_model = 32
n_layers = 4
n_heads = 4
n_kv_heads = 2
ffn_hidden = 48
n_experts = 4
top_k = 2

[data]
task = "tokens"
format = "megatron"
prefix = "corpus_text_document"
split = "90,10"
seq_len = 32
micro_batch_size = 1
num_microbatches = 4

[train]
steps = 4
lr = 1e-2
warmup_steps = 1

[eval]
every = 2
steps = 2
"""
MESH8 = ["--set", "parallel.pp=2", "--set", "parallel.cp=2", "--set", "parallel.ep=2",
         "--set", "data.num_microbatches=2", "--set", "topology.nodes=2",
         "--set", "topology.devices_per_node=4", "--set", "topology.nvlink_domain=4"]


def trident_eval(np_, args, timeout=180):
    cmd = ([BIN] if np_ == 1 else MPIRUN + ["-np", str(np_), BIN]) + ["eval"] + args
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=timeout)
    m = re.search(r"validation loss ([0-9.]+), perplexity ([0-9.]+) over (\d+) targets", p.stdout)
    return p.returncode, (float(m.group(1)) if m else None), (int(m.group(3)) if m else None), p


def main():
    work = tempfile.mkdtemp(prefix="trident-data-test-")
    os.chdir(work)
    docs = make_megatron_data.documents(DOCS, 32, 16, seed=3)
    make_megatron_data.write("corpus_text_document", docs)
    with open("job.toml", "w") as f:
        f.write(CONFIG)

    # 1. training with validation every 2 steps
    rc, out, err, _ = launch(1, ["job.toml", "--output", "train.h5",
                                 "--set", "output.checkpoint_dir=ck"])
    check(rc == 0, "1-rank training on the Megatron dataset (rc=%d: %s)" % (rc, err.strip()[-300:]))
    eval_lines = [l for l in out.splitlines() if l.startswith("eval ")]
    check(len(eval_lines) == 2, "two eval lines in the log (%r)" % eval_lines)
    with h5py.File("train.h5", "r") as f:
        ev = f["metrics/eval"][:]
        check(list(ev["step"]) == [2, 4], "/metrics/eval after steps 2 and 4 (%r)" % list(ev["step"]))
        check(np.allclose(ev["perplexity"], np.exp(ev["loss"])), "perplexity = exp(loss)")
        check(ev["loss"][1] < ev["loss"][0], "validation loss falls (%r)" % list(ev["loss"]))
        hist = f["data/document_lengths"][:]
        lengths = np.array([len(d) for d in docs[: round(DOCS * 0.9)]])
        want = np.bincount(np.floor(np.log2(lengths)).astype(int))
        check(list(hist) == list(want), "/data/document_lengths = the training documents' "
              "log2 histogram (%r vs %r)" % (list(hist), list(want)))
    # each validation batch counts every target: 4 sequences of 32 per batch
    check(int(ev["targets"][0]) == 2 * 4 * 32, "targets per validation (%d)" % ev["targets"][0])

    # 2. trident eval of the final checkpoint: 1 rank = the run's own, = 8 ranks
    ckpt = "ck/ckpt_step_%08d.h5" % 4
    rc1, loss1, t1, p1 = trident_eval(1, ["job.toml", "--checkpoint", ckpt])
    check(rc1 == 0 and loss1 is not None, "trident eval on 1 rank (rc=%d: %s %s)"
          % (rc1, p1.stdout.strip()[-200:], p1.stderr.strip()[-300:]))
    if loss1 is not None:
        check(abs(loss1 - float(ev["loss"][1])) <= 1e-6 * abs(loss1),
              "1-rank eval %.6f = the run's validation at step 4 %.6f" % (loss1, ev["loss"][1]))
    rc8, loss8, t8, p8 = trident_eval(8, ["job.toml", "--checkpoint", ckpt] + MESH8)
    check(rc8 == 0 and loss8 is not None, "trident eval on 8 ranks pp=2 dp=2 cp=2 ep=2 (rc=%d: %s)"
          % (rc8, p8.stderr.strip()[-300:]))
    if loss1 is not None and loss8 is not None:
        check(t1 == t8 and abs(loss8 - loss1) <= 1e-5 * abs(loss1),
              "8-rank eval %.7f (%s targets) = 1-rank %.7f (%s targets) within 1e-5 relative"
              % (loss8, t8, loss1, t1))

    # 3. bad input: exit 2, one line naming the file (and the byte offset)
    def bad(name, expect, extra=(), outname="bad.h5", np_=1):
        rc, out, err, _ = launch(np_, ["job.toml", "--output", outname] + list(extra))
        lines = [l for l in err.strip().splitlines() if l.startswith("trident: error")]
        check(rc == 2 and len(lines) == 1 and all(e in lines[0] for e in expect),
              "%s: exit 2 and %r (rc=%d, stderr: %s)" % (name, expect, rc, err.strip()[-300:]))
        check(not os.path.exists(outname), "%s: no run file left behind" % name)

    def variant(name, edit_bin=None, edit_idx=None):
        prefix = "v_" + name
        make_megatron_data.write(prefix, docs)
        for ext, edit in ((".bin", edit_bin), (".idx", edit_idx)):
            if edit:
                with open(prefix + ext, "rb") as f:
                    blob = bytearray(f.read())
                with open(prefix + ext, "wb") as f:
                    f.write(edit(blob))
        return ["--set", "data.prefix=" + prefix]

    n = len(docs)
    last_ptr_at = 34 + 4 * n + 8 * (n - 1)
    bad("truncated .bin", ["v_trunc.idx' byte offset %d" % last_ptr_at, "runs past the end"],
        variant("trunc", edit_bin=lambda b: b[:-2]))
    bad("bad magic", ["v_magic.idx' byte offset 0", "bad magic"],
        variant("magic", edit_idx=lambda b: b"XXXXXXX\0\0" + b[9:]))

    def far_pointer(b):
        b[34 + 4 * n + 8: 34 + 4 * n + 16] = np.array([1 << 30], "<i8").tobytes()
        return b
    bad("pointer past the end", ["v_ptr.idx' byte offset %d" % (34 + 4 * n + 8)],
        variant("ptr", edit_idx=far_pointer))

    def big_id(b):
        b[10:12] = np.array([40], "<u2").tobytes()
        return b
    bad("id >= vocab_size", ["v_vocab.bin' byte offset 10", "token id 40", "vocab_size = 32"],
        variant("vocab", edit_bin=big_id))
    bad("too short for one sequence", ["shorter than one sample"], ["--set", "data.seq_len=4000"])
    rc, _, _, p = trident_eval(1, ["job.toml", "--checkpoint", ckpt, "--set", "data.split=100,0",
                                   "--set", "eval.every=0"])
    check(rc == 2 and "needs validation data" in p.stderr,
          "trident eval without validation data: exit 2 (%s)" % p.stderr.strip())
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
