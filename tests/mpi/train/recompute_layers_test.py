#!/usr/bin/env python3
"""What parity between recomputation modes cannot see, on 1 rank (fast):
train.recompute_layers = N against the layers actually recomputed (the
allocator's activations at the peak, one layer's cache per layer), and
train.precision = "bf16" with recomputation bit-identical to bf16 without."""
import sys
import tempfile

import numpy as np

from mpirun_cli import check, verdict

# One rank, the quickstart model, two steps: recompute_test.py's runner.
from recompute_test import ONE_RANK, run  # noqa: E402


def recompute_layers(d):
    """train.recompute_layers = N against the layers recomputed, on 1 rank (4
    layers, full recomputation): the allocator's activations at the peak fall
    by one layer's cache for each of the first three layers recomputed, by
    exactly the same bytes each time; the last layer saves nothing on one
    rank (its backward begins right after its forward, so its recomputation
    runs at the peak), so N = 3, N = 4 and N = 0 (every layer) hold the same;
    losses and final tensors bit-identical throughout."""
    base = run(d, "layers-none", 1, ONE_RANK)
    if base is None:
        return
    act = {"none": base[1][1][0]}
    for n in (1, 2, 3, 4, 0):
        got = run(d, "layers-%d" % n, 1, ONE_RANK + ["--set", "train.recompute=full",
                                                     "--set", "train.recompute_layers=%d" % n])
        if got is None:
            return
        act[n] = got[1][1][0]
        check(all(np.array_equal(base[0][k], got[0][k]) for k in ("loss", "grad_norm")) and
              all(np.array_equal(base[2][k], got[2][k]) for k in base[2]),
              "recompute_layers=%d: losses, grad norms and final tensors bit-identical" % n)
    step = act["none"] - act[1]
    print("     activations at the peak by recompute_layers: none %d, 1 %d, 2 %d, 3 %d, 4 %d, "
          "0 (all) %d bytes" % (act["none"], act[1], act[2], act[3], act[4], act[0]))
    check(step > 0 and act[1] - act[2] == step and act[2] - act[3] == step,
          "recompute_layers = 1, 2, 3: each further layer frees the same %d bytes at the peak"
          % step)
    check(act[3] == act[4] == act[0], "recompute_layers = 3, 4 and 0 (all) hold the same "
          "activations at the peak (%d, %d, %d)" % (act[3], act[4], act[0]))


def bf16_recompute(d):
    """train.precision = "bf16" with recomputation equals bf16 without, bit for
    bit (losses, gradient norms, final fp32 master tensors), on 1 rank: the
    recomputed forward rounds to bf16 exactly as the first did."""
    bf16 = ONE_RANK + ["--set", "train.precision=bf16"]
    base = run(d, "bf16-none", 1, bf16)
    if base is None:
        return
    for mode in ("full", "selective"):
        got = run(d, "bf16-" + mode, 1, bf16 + ["--set", "train.recompute=" + mode])
        if got is None:
            return
        check(all(np.array_equal(base[0][k], got[0][k]) for k in ("loss", "aux_loss", "grad_norm"))
              and base[2].keys() == got[2].keys()
              and all(np.array_equal(base[2][k], got[2][k]) for k in base[2]),
              "bf16, recompute=%s: losses, grad norms and final tensors bit-identical to bf16 "
              "without (loss %.6f -> %.6f)" % (mode, got[0]["loss"][0], got[0]["loss"][-1]))


def main():
    with tempfile.TemporaryDirectory() as d:
        recompute_layers(d)
        bf16_recompute(d)
    return verdict()


if __name__ == "__main__":
    sys.exit(main())
