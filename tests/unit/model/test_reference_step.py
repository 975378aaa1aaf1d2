"""trident's training step against an independent float64 model
(reference_model.py), on one rank, from trident's own checkpoints.

Each case runs `trident run` for 3 steps on a tiny model (token file data,
checkpoint after every step), then, for steps 1 and 2, loads the checkpoint
written before the step, computes the step in numpy and compares with what
trident reported and saved: the learning rate, the loss, the aux and z
losses, the gradient norm (sqrt of the sum of squares of every gradient),
the tokens per expert, and after the update every parameter, both AdamW
moments and the router biases. The cases cover clipping active and inactive,
weight decay on and off, softmax and sigmoid_bias routers, a dense and an MoE
layer, grouped-query attention and the cosine phase after a warm-up.

Tolerances (fp32 against fp64, a few steps): loss and norms 1e-5 relative;
moments and the parameters' change 1e-4 relative (L2 over each tensor).
"""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_model as ref  # noqa: E402

BIN = os.environ["TRIDENT_BIN"]
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    den = np.linalg.norm(b)
    return np.linalg.norm(a - b) / (den if den > 0 else 1.0)


MODEL = dict(vocab_size=24, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=24,
             n_experts=4, top_k=2, moe_every=2, rope_theta=10000.0, init_std=0.3,
             aux_loss_coef=0.05, z_loss_coef=0.01, router="softmax", norm_topk=True,
             router_bias_rate=0.01)
TRAIN = dict(steps=3, lr=0.02, warmup_steps=1, min_lr_ratio=0.1, weight_decay=0.0,
             grad_clip=1.0, beta1=0.9, beta2=0.95, eps=1e-8)
DATA = dict(seq_len=8, micro_batch_size=2, num_microbatches=2)


def toml_value(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"%s"' % v
    return repr(v)


def write_config(path, model, train, data, token_file, ckpt_dir):
    sections = {
        "model": model,
        "data": dict(data, task="tokens", token_file=token_file, token_dtype="uint16"),
        "train": {k: v for k, v in train.items()},
        "runtime": dict(backend="cpu"),
        "output": dict(checkpoint_every=1, checkpoint_dir=ckpt_dir, timeline=False),
    }
    with open(path, "w") as f:
        for name, keys in sections.items():
            f.write("[%s]\n" % name)
            for k, v in keys.items():
                f.write("%s = %s\n" % (k, toml_value(v)))


def batch_of_step(ids, step, data):
    """The token-file task's samples (hdf5 docs): sample g of step s starts at
    ((s * global_batch + g) * L) mod (n - L); targets are the next tokens."""
    L, mbs, nmb = data["seq_len"], data["micro_batch_size"], data["num_microbatches"]
    B = mbs * nmb
    span = len(ids) - L
    out = []
    for m in range(nmb):
        tok, tgt = [], []
        for s in range(mbs):
            g = m * mbs + s
            start = ((step * B + g) * L) % span
            tok.append(ids[start:start + L])
            tgt.append(ids[start + 1:start + L + 1])
        out.append((np.array(tok, dtype=np.int64), np.array(tgt, dtype=np.int64)))
    return out


def read_checkpoint(path):
    with h5py.File(path, "r") as f:
        t = f["tensors"]
        get = lambda grp: {n: t[grp][n][()].astype(np.float64) for n in t[grp]} if grp in t else {}
        return (get("param"), get("adam_m"), get("adam_v"), get("buffer"),
                int(f.attrs["optimizer_steps"]), int(f.attrs["step"]))


def biases_of(buffers):
    out = {}
    for name, v in buffers.items():
        if name.endswith(".moe.router_bias"):
            out[int(name.split(".")[1])] = v
    return out


def run_case(label, model, train, tmp):
    print("== %s" % label, flush=True)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, model["vocab_size"], size=400).astype(np.uint16)
    token_file = os.path.join(tmp, label + ".tokens")
    ids.tofile(token_file)
    ckpt_dir = os.path.join(tmp, label + "-ckpt")
    cfg_path = os.path.join(tmp, label + ".toml")
    run_path = os.path.join(tmp, label + ".h5")
    write_config(cfg_path, model, train, DATA, token_file, ckpt_dir)
    p = subprocess.run([BIN, "run", cfg_path, "--output", run_path], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=120)
    if p.returncode != 0:
        print(p.stdout)
    check(p.returncode == 0, "%s: trident run exits 0" % label)
    if p.returncode != 0:
        return
    with h5py.File(run_path, "r") as f:
        metrics = f["metrics/steps"][()]
        expert_tokens = f["metrics/expert_tokens"][()]
    ckpt = lambda s: os.path.join(ckpt_dir, "ckpt_step_%08d.h5" % s)
    clipped = []
    for step in (1, 2):
        params, m, v, buffers, adam_steps, done = read_checkpoint(ckpt(step))
        check(done == step, "%s: checkpoint %d records %d steps done" % (label, step, done))
        biases = biases_of(buffers)
        r = ref.train_step(params, m, v, biases, adam_steps, model, train,
                           batch_of_step(ids.astype(np.int64), step, DATA), step)
        # Near-ties in the top-k would make fp32 and fp64 route differently:
        # the data and init are chosen so that none is that close.
        check(r.routing_margin > 1e-4, "%s step %d: top-k margin %.2e > 1e-4 (a setup check)"
              % (label, step, r.routing_margin))
        row = metrics[step]
        tag = "%s step %d" % (label, step)
        check(abs(row["lr"] - r.lr) <= 1e-12 * r.lr,
              "%s: lr %.10g == reference %.10g" % (tag, row["lr"], r.lr))
        for key, want in (("loss", r.loss), ("aux_loss", r.aux_loss), ("z_loss", r.z_loss),
                          ("grad_norm", r.grad_norm)):
            got = float(row[key])
            check(abs(got - want) <= 1e-5 * abs(want),
                  "%s: %s %.8g == reference %.8g" % (tag, key, got, want))
        for layer, load in sorted(r.loads.items()):
            moe_index = sum(1 for l in range(layer) if ref.is_moe_layer(model, l))
            got = [int(x) for x in expert_tokens[step, moe_index]]
            check(got == [int(x) for x in load], "%s: layer %d tokens per expert %s == reference %s"
                  % (tag, layer, got, [int(x) for x in load]))
        clipped.append(r.clip_scale < 1.0)
        p2, m2, v2, buffers2, adam_steps2, _ = read_checkpoint(ckpt(step + 1))
        check(adam_steps2 == adam_steps + 1, "%s: one optimizer step taken" % tag)
        worst = {}
        for n in params:
            worst[n] = max(rel(m2[n], r.adam_m[n]), rel(v2[n], r.adam_v[n]),
                           rel(p2[n] - params[n], r.params[n] - params[n]))
        name = max(worst, key=worst.get)
        check(worst[name] <= 1e-4, "%s: every parameter, moment and update within 1e-4 of the "
              "reference (%d tensors, worst %.2e: %s)" % (tag, len(worst), worst[name], name))
        for layer, b in sorted(r.biases.items()):
            got = buffers2["layers.%d.moe.router_bias" % layer]
            check(np.allclose(got, b, rtol=0, atol=1e-6),
                  "%s: layer %d router bias %s == reference %s" % (tag, layer, got, b))
    return clipped


def check_differentiator():
    """Guards the reference itself: its gradient of the step's objective
    against central differences on a few elements of every parameter."""
    rng = np.random.default_rng(3)
    model = dict(MODEL, router="sigmoid_bias", norm_topk=False)
    V, d, f, E = model["vocab_size"], model["d_model"], model["ffn_hidden"], model["n_experts"]
    Hd = d  # n_heads * head_dim
    kvd = model["n_kv_heads"] * (d // model["n_heads"])
    shapes = {"embedding": (V, d), "final_norm": (d,), "lm_head": (V, d)}
    for l in range(model["n_layers"]):
        p = "layers.%d." % l
        shapes.update({p + "attn.norm": (d,), p + "attn.wq": (Hd, d), p + "attn.wk": (kvd, d),
                       p + "attn.wv": (kvd, d), p + "attn.wo": (d, Hd), p + "ffn_norm": (d,)})
        if ref.is_moe_layer(model, l):
            shapes[p + "moe.router"] = (E, d)
            for e in range(E):
                for w, s in (("w_gate", (f, d)), ("w_up", (f, d)), ("w_down", (d, f))):
                    shapes[p + "moe.experts.%d.%s" % (e, w)] = s
        else:
            shapes.update({p + "ffn.w_gate": (f, d), p + "ffn.w_up": (f, d), p + "ffn.w_down": (d, f)})
    params = {n: rng.normal(0, 0.3, s) + (1.0 if n.endswith("norm") else 0.0)
              for n, s in shapes.items()}
    biases = {l: rng.normal(0, 0.1, E) for l in range(model["n_layers"]) if ref.is_moe_layer(model, l)}
    tokens = rng.integers(0, V, size=(2, 6))
    targets = rng.integers(0, V, size=(2, 6))

    def objective(P_values):
        g = ref.Graph()
        P = {n: g.leaf(v) for n, v in P_values.items()}
        ce, stats = ref.forward_microbatch(P, model, tokens, targets, biases)
        obj = ce * (1.0 / tokens.size)
        for _, st in stats:
            obj = obj + (st.aux + st.z) * 0.5
        return g, P, obj

    g, P, obj = objective(params)
    g.backward(obj)
    worst = 0.0
    h = 1e-5
    for n in sorted(params):
        flat = params[n].reshape(-1)
        for i in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            keep = flat[i]
            flat[i] = keep + h
            up = float(objective(params)[2].value)
            flat[i] = keep - h
            down = float(objective(params)[2].value)
            flat[i] = keep
            fd = (up - down) / (2 * h)
            an = float(P[n].grad.reshape(-1)[i])
            worst = max(worst, abs(fd - an) / max(1e-6, abs(fd)))
    check(worst < 1e-4, "reference gradient against central differences (worst rel %.2e)" % worst)


def main():
    check_differentiator()
    with tempfile.TemporaryDirectory() as tmp:
        # Clipping active, weight decay on.
        clipped = run_case("softmax-clip-decay", MODEL, dict(TRAIN, grad_clip=0.05, weight_decay=0.1),
                           tmp)
        if clipped is not None:
            check(all(clipped), "softmax-clip-decay: the reference clips at both steps")
        # Clipping inactive, sigmoid router with its bias, no renormalised weights.
        model = dict(MODEL, router="sigmoid_bias", norm_topk=False)
        clipped = run_case("sigmoid-noclip", model, dict(TRAIN, grad_clip=100.0, weight_decay=0.05),
                           tmp)
        if clipped is not None:
            check(not any(clipped), "sigmoid-noclip: the reference clips at neither step")
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
