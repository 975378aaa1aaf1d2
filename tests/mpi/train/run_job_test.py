#!/usr/bin/env python3
"""`trident run` end to end under mpirun: checkpoints and bit-for-bit resume
(stopped by SIGUSR1 and resumed; a rank SIGKILLed and the last checkpoint
resumed), a real SIGUSR1 sent to mpirun, and bad inputs (another model's
checkpoint, a corrupted checkpoint, a checkpoint of an older format, a token
file shorter than one sample)
that must exit 2 with one clear line and leave no run file behind."""
import os
import signal
import subprocess
import sys
import tempfile

import h5py
import numpy as np

from mpirun_cli import (BIN, MPIRUN, check, checkpoint_names, checkpoint_tensors, launch, small_mesh,
                        verdict)
NP = 4
STEPS = 8
TIMEOUT_S = 20  # runtime.timeout_s of these runs: the watchdog deadline

CONFIG = small_mesh(model=['router = "sigmoid_bias"'], data=['task = "recall"'],
                    parallel=['schedule = "1f1b"']) + """
[train]
steps = %d
lr = 1e-2
warmup_steps = 2

[runtime]
timeout_s = %d

[output]
timeline = true
activation_steps = [1]
activation_layers = [1]
activation_samples = [0]

[topology]
nodes = 1
devices_per_node = 4
nvlink_domain = 4
""" % (STEPS, TIMEOUT_S)




def run(args, env=None, timeout=120):
    return launch(NP, args, env, timeout)


def losses(path):
    with h5py.File(path, "r") as f:
        steps = f["metrics/steps"][:]
        return {int(r["step"]): float(r["loss"]) for r in steps}


def main():
    work = tempfile.mkdtemp(prefix="trident-run-test-")
    os.chdir(work)
    with open("job.toml", "w") as f:
        f.write(CONFIG)

    # 1. the uninterrupted run
    # (format "single": one gathered file, whose dataset offsets the damage
    # checks below use; the resumed runs write the sharded default, and their
    # final checkpoint is compared with this one bit for bit through h5py)
    rc, out, err, _ = run(["job.toml", "--output", "full.h5", "--set", "output.checkpoint_dir=ck_full",
                           "--set", "output.checkpoint_format=single"])
    check(rc == 0, "uninterrupted run exits 0 (rc=%d) %s" % (rc, err.strip()[-300:]))
    full = losses("full.h5")
    check(sorted(full) == list(range(STEPS)), "run file holds every step")
    check("done:" in out and "step     0" in out, "progress lines and a summary on rank 0")
    with h5py.File("full.h5", "r") as f:
        check(f.attrs.get("completed", 0) == 1, "run file marked complete")
        q = f["activations/step_1/layer_1/q"][()]
        check(q.shape == (1, 32, 4, 8) and np.isfinite(q).all(),
              "activation q captured whole, in global order: %s" % (q.shape,))
        check("router_logits" in f["activations/step_1/layer_1"], "router logits captured")
        kinds = set(k.decode() if isinstance(k, bytes) else k for k in f["timeline/events"]["kind"])
        check({"F", "B"} <= kinds, "timeline holds F and B events: %s" % sorted(kinds))

    # 2. stopped by SIGUSR1 after step 3 (raised by rank 1), then resumed
    rc, out, err, _ = run(["job.toml", "--output", "part1.h5", "--set", "output.checkpoint_dir=ck_sig"],
                          env={"TRIDENT_TEST_SIGNAL_AT_STEP": "3", "TRIDENT_TEST_RANK": "1"})
    check(rc == 0, "SIGUSR1 stop exits 0 (rc=%d)" % rc)
    check("stopped by signal" in out, "stop message printed")
    check(os.path.exists("ck_sig/ckpt_step_00000004.h5"), "checkpoint at step 4 written")
    check(not any(".tmp" in n for n in os.listdir("ck_sig")), "no temporary checkpoint left")
    rc, out, err, _ = run(["job.toml", "--output", "part2.h5", "--set", "output.checkpoint_dir=ck_sig",
                           "--resume"])
    check(rc == 0, "resume from latest exits 0 (rc=%d) %s" % (rc, err.strip()[-300:]))
    merged = dict(losses("part1.h5"))
    merged.update(losses("part2.h5"))
    check(sorted(losses("part2.h5")) == list(range(4, STEPS)), "resumed run starts at step 4")
    same = all(merged.get(s) == full[s] for s in range(STEPS))
    check(same, "resumed losses equal the uninterrupted run's exactly")
    for s in range(STEPS):
        print("  step %d: full %.9f  stop+resume %.9f" % (s, full[s], merged.get(s, float("nan"))))
    pf, pr = checkpoint_tensors("ck_full/ckpt_step_%08d.h5" % STEPS), checkpoint_tensors("ck_sig/ckpt_step_%08d.h5" % STEPS)
    check(pf.keys() == pr.keys() and all(np.array_equal(pf[k], pr[k]) for k in pf),
          "final parameters, optimizer state and router biases identical (%d tensors)" % len(pf))

    # 3. a rank SIGKILLed during step 5: the job ends within the deadline, the
    #    last checkpoint (step 4) stays readable and resumes bit for bit
    rc, out, err, took = run(["job.toml", "--output", "killed.h5", "--set", "output.checkpoint_dir=ck_kill",
                              "--set", "output.checkpoint_every=2"],
                             env={"TRIDENT_TEST_KILL_AT_STEP": "5", "TRIDENT_TEST_RANK": "2"})
    check(rc != 0, "killed job exits non-zero (rc=%d)" % rc)
    check(took < TIMEOUT_S + 15, "killed job ended in %.1f s (deadline %d s)" % (took, TIMEOUT_S))
    msg = (out + err).lower()
    check("signal 9" in msg or "killed" in msg or "exited on signal" in msg,
          "a message names the killed process: %s" % (err.strip().splitlines() or [""])[-1][:200])
    latest = checkpoint_names("ck_kill")
    check(latest and latest[-1] == "ckpt_step_00000004.h5", "last checkpoint is step 4: %s" % latest)
    with h5py.File("ck_kill/ckpt_step_00000004.h5", "r") as f:
        check(int(f.attrs["step"]) == 4, "last checkpoint readable with h5py")
    with h5py.File("killed.h5", "r") as f:
        check(len(f["metrics/steps"]) >= 5, "killed run's run file readable up to the last step")
    rc, out, err, _ = run(["job.toml", "--output", "after_kill.h5", "--set", "output.checkpoint_dir=ck_kill",
                           "--resume"])
    check(rc == 0, "resume after the kill exits 0 (rc=%d)" % rc)
    after = losses("after_kill.h5")
    check(all(after.get(s) == full[s] for s in range(4, STEPS)),
          "losses after the kill and resume equal the uninterrupted run's")

    # 4. a real SIGUSR1 sent to mpirun (forwarded to every rank)
    e = dict(os.environ)
    p = subprocess.Popen(MPIRUN + ["-np", str(NP), BIN, "run", "job.toml", "--output", "sig.h5",
                                   "--set", "output.checkpoint_dir=ck_real", "--set", "train.steps=100000"],
                         env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    while True:
        line = p.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("step ") and "step     2" in line:
            p.send_signal(signal.SIGUSR1)
            break
    rest, err = p.communicate(timeout=120)
    out = "".join(lines) + rest
    check(p.returncode == 0, "SIGUSR1 to mpirun: exit 0 (rc=%s) %s" % (p.returncode, err.strip()[-200:]))
    check("stopped by signal 10" in out, "SIGUSR1 to mpirun: stop message")
    check(any(n.endswith(".h5") for n in os.listdir("ck_real") if os.path.isdir("ck_real")),
          "SIGUSR1 to mpirun: checkpoint written")

    # 5. bad inputs: exit 2, one clear line, no run file
    def bad(args, expect, what, outname):
        rc, out, err, _ = run(args + ["--output", outname])
        lines = [l for l in err.strip().splitlines() if l.startswith("trident: error")]
        check(rc == 2 and lines and expect in lines[0],
              "%s: exit 2 and '%s' (rc=%d, stderr: %s)" % (what, expect, rc, err.strip()[-300:]))
        check(not os.path.exists(outname), "%s: no run file left behind" % what)

    bad(["job.toml", "--set", "model.d_model=48", "--resume", "ck_full/ckpt_step_%08d.h5" % STEPS],
        "belongs to another model", "checkpoint of another model", "bad1.h5")
    # flip bytes inside one tensor's data: its checksum no longer matches
    src = "ck_full/ckpt_step_%08d.h5" % STEPS
    with open(src, "rb") as f:
        blob = bytearray(f.read())
    with h5py.File(src, "r") as f:
        off = f["tensors/param/lm_head"].id.get_offset()
    for i in range(16):
        blob[off + i] ^= 0x5A
    os.makedirs("ck_bad", exist_ok=True)
    with open("ck_bad/flipped.h5", "wb") as f:
        f.write(blob)
    bad(["job.toml", "--resume", "ck_bad/flipped.h5"], "corrupted", "corrupted checkpoint (flipped bytes)",
        "bad2.h5")
    with open("ck_bad/truncated.h5", "wb") as f:
        f.write(blob[: len(blob) // 3])
    bad(["job.toml", "--resume", "ck_bad/truncated.h5"], "--resume", "corrupted checkpoint (truncated)",
        "bad3.h5")
    # a checkpoint of the previous format (SwiGLU and router weights [in, out])
    with open("ck_bad/version1.h5", "wb") as f:
        f.write(open(src, "rb").read())
    with h5py.File("ck_bad/version1.h5", "r+") as f:
        f.attrs["format_version"] = np.int64(1)
    bad(["job.toml", "--resume", "ck_bad/version1.h5"], "has format_version 1",
        "checkpoint of format_version 1", "bad5.h5")
    np.arange(20, dtype=np.uint16).tofile("short.bin")
    bad(["job.toml", "--set", "data.task=tokens", "--set", "data.token_file=short.bin"],
        "shorter than one sample", "token file shorter than one sample", "bad4.h5")

    return verdict()


if __name__ == "__main__":
    sys.exit(main())
