#!/usr/bin/env python3
"""train.recompute: losses, aux losses and gradient norms bit-identical with
and without recomputation (full and selective), on 1 rank and on the 8-rank
quickstart mesh (pp2 cp2 dp2 ep2: the ring and the MoE exchange are
recomputed by full, the SwiGLU activations of the dense FFN and of the
experts by selective) under every schedule (AFAB, 1F1B, interleaved, the
B/W-split ZB-H1, ZB-V and DualPipeV); the final checkpoints' tensors equal;
the allocator's peak per rank falls with full recomputation, and its
activations at the peak fall with selective (the gate and up activations
dropped after the forward)."""
import os
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import check, checkpoint_names, checkpoint_tensors, launch, verdict

SRC = os.environ["TRIDENT_SOURCE_DIR"]
QUICKSTART = os.path.join(SRC, "share/trident/examples/quickstart.toml")
STEPS = 2
ONE_RANK = ["--set", "data.num_microbatches=8", "--set", "parallel.pp=1", "--set", "parallel.cp=1",
            "--set", "parallel.ep=1", "--set", "topology.nodes=1",
            "--set", "topology.devices_per_node=1", "--set", "topology.nvlink_domain=1"]
ZB = ["--set", "parallel.schedule=zb-h1", "--set", "model.n_layers=4"]
INTERLEAVED = ["--set", "parallel.schedule=interleaved", "--set", "parallel.vpp=2"]
V = ["--set", "parallel.vpp=2"]
MESHES = [("1 rank", 1, ONE_RANK), ("pp2 cp2 dp2 ep2 1f1b", 8, []),
          ("pp2 cp2 dp2 ep2 afab", 8, ["--set", "parallel.schedule=afab"]),
          ("pp2 cp2 dp2 ep2 zb-h1", 8, ZB), ("pp2 cp2 dp2 ep2 interleaved", 8, INTERLEAVED),
          ("pp2 cp2 dp2 ep2 zb-v", 8, ["--set", "parallel.schedule=zb-v"] + V),
          ("pp2 cp2 dp2 ep2 dualpipev", 8, ["--set", "parallel.schedule=dualpipev"] + V)]


def run(d, tag, np_, extra):
    out = os.path.join(d, tag + ".h5")
    ck = os.path.join(d, "ck-" + tag)
    rc, _, err, secs = launch(np_, [QUICKSTART, "--set", "train.steps=%d" % STEPS,
                                    "--set", "output.checkpoint_dir=" + ck,
                                    "--set", "output.timeline=false", "--output", out] + extra,
                              timeout=240)
    check(rc == 0, "%s exits 0 (%.0f s)%s" % (tag, secs, "" if rc == 0 else ": " + err[-400:]))
    if rc != 0:
        return None
    with h5py.File(out, "r") as f:
        steps = f["metrics/steps"][:]
        summary = f["ranks/summary"][:]
        peak = (summary["peak_alloc_bytes"], summary["peak_activations_bytes"])
    last = checkpoint_names(ck)[-1]
    return steps, peak, checkpoint_tensors(os.path.join(ck, last))


def main():
    with tempfile.TemporaryDirectory() as d:
        for mesh, np_, extra in MESHES:
            base = run(d, mesh.replace(" ", "_") + "-none", np_, extra)
            if base is None:
                return verdict()
            for mode in ("full", "selective"):
                got = run(d, mesh.replace(" ", "_") + "-" + mode, np_,
                          extra + ["--set", "train.recompute=" + mode])
                if got is None:
                    return verdict()
                same = all(np.array_equal(base[0][k], got[0][k])
                           for k in ("loss", "aux_loss", "grad_norm"))
                check(same, "%s, recompute=%s: loss, aux loss and grad norm bit-identical (loss %.6f -> %.6f)"
                      % (mesh, mode, got[0]["loss"][0], got[0]["loss"][-1]))
                tensors_same = base[2].keys() == got[2].keys() and all(
                    np.array_equal(base[2][k], got[2][k]) for k in base[2])
                check(tensors_same, "%s, recompute=%s: final checkpoint tensors bit-identical (%d)"
                      % (mesh, mode, len(base[2])))
                ratio = got[1][0].max() / base[1][0].max()
                # activations at the peak of the rank with the highest peak
                act = lambda r: r[1][1][r[1][0].argmax()]
                act_ratio = act(got) / act(base)
                print("     %s, recompute=%s: peak allocator bytes per rank %.2f MB -> %.2f MB (x%.2f), "
                      "activations at the peak %.2f MB -> %.2f MB (x%.2f)"
                      % (mesh, mode, base[1][0].max() / 1e6, got[1][0].max() / 1e6, ratio,
                         act(base) / 1e6, act(got) / 1e6, act_ratio))
                if mode == "full":
                    check(ratio < 0.95, "%s, recompute=full lowers the peak allocator bytes (x%.2f)"
                          % (mesh, ratio))
                else:
                    check(ratio <= 1.0, "%s, recompute=selective does not raise the peak (x%.2f)"
                          % (mesh, ratio))
                    check(act_ratio < 0.95, "%s, recompute=selective lowers the activations at the "
                          "peak (x%.2f)" % (mesh, act_ratio))
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
