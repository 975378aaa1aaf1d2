"""An independent float64 implementation of trident's model and optimizer
step, written from the definitions (share/trident/config-reference.md,
hdf5-layout.md, kernels/router.hpp), not from trident's code paths: the
forward is plain numpy and the gradients come from a small reverse-mode
differentiator below, so no hand-written backward is shared with trident.

The model: token embedding; per layer x + attn(rmsnorm(x)) with RoPE on q and
k, causal softmax(q kᵀ/√D) v, query head h reading kv head h // (H / Hkv);
then x + ffn(rmsnorm(x)), a SwiGLU MLP or, on MoE layers, a router (softmax
or sigmoid scores, top-k, weights renormalised over the k when norm_topk)
over SwiGLU experts with the Switch load-balancing loss and the z-loss; a
final rmsnorm, the LM head and cross-entropy. Objective of a step:
sum(CE) / targets + (sum(aux) + sum(z)) / samples. AdamW with bias
correction, decoupled weight decay on the weight matrices (not on the
embedding nor the norms), and clipping of the global gradient norm.
"""
import math

import numpy as np

NORM_EPS = 1e-5


# ---- a small reverse-mode differentiator over numpy arrays ----

class Graph:
    """Nodes in creation order; backward() walks them in reverse."""

    def __init__(self):
        self.nodes = []

    def leaf(self, value):
        return Node(self, np.asarray(value, dtype=np.float64), ())

    def const(self, value):
        return Node(self, np.asarray(value, dtype=np.float64), (), track=False)

    def backward(self, out):
        out.grad = np.ones_like(out.value)
        for n in reversed(self.nodes):
            if n.grad is None:
                continue
            for parent, vjp in n.parents:
                if parent.track:
                    g = vjp(n.grad)
                    parent.grad = g if parent.grad is None else parent.grad + g


def _unbroadcast(g, shape):
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    return g


class Node:
    def __init__(self, graph, value, parents, track=True):
        self.graph, self.value, self.parents, self.grad = graph, value, parents, None
        self.track = track or any(p.track for p, _ in parents)
        graph.nodes.append(self)

    def _new(self, value, parents):
        return Node(self.graph, value, parents)

    def _wrap(self, other):
        return other if isinstance(other, Node) else self.graph.const(other)

    @property
    def shape(self):
        return self.value.shape

    def __add__(self, other):
        o = self._wrap(other)
        return self._new(self.value + o.value, ((self, lambda g: _unbroadcast(g, self.shape)),
                                                (o, lambda g: _unbroadcast(g, o.shape))))

    __radd__ = __add__

    def __neg__(self):
        return self._new(-self.value, ((self, lambda g: -g),))

    def __sub__(self, other):
        return self + (-self._wrap(other))

    def __rsub__(self, other):
        return self._wrap(other) + (-self)

    def __mul__(self, other):
        o = self._wrap(other)
        return self._new(self.value * o.value,
                         ((self, lambda g: _unbroadcast(g * o.value, self.shape)),
                          (o, lambda g: _unbroadcast(g * self.value, o.shape))))

    __rmul__ = __mul__

    def __truediv__(self, other):
        return self * (self._wrap(other) ** -1.0)

    def __pow__(self, p):
        assert not isinstance(p, Node)
        return self._new(self.value ** p, ((self, lambda g: g * p * self.value ** (p - 1)),))

    def __matmul__(self, other):
        a, b = self.value, other.value
        return self._new(a @ b, ((self, lambda g: _unbroadcast(g @ np.swapaxes(b, -1, -2), a.shape)),
                                 (other, lambda g: _unbroadcast(np.swapaxes(a, -1, -2) @ g, b.shape))))

    def exp(self):
        y = np.exp(self.value)
        return self._new(y, ((self, lambda g: g * y),))

    def log(self):
        return self._new(np.log(self.value), ((self, lambda g: g / self.value),))

    def sigmoid(self):
        s = 1.0 / (1.0 + np.exp(-self.value))
        return self._new(s, ((self, lambda g: g * s * (1.0 - s)),))

    def sum(self, axis=None, keepdims=False):
        shape = self.shape

        def vjp(g):
            if axis is not None and not keepdims:
                g = np.expand_dims(g, axis)
            return np.broadcast_to(g, shape).copy()
        return self._new(self.value.sum(axis=axis, keepdims=keepdims), ((self, vjp),))

    def mean(self, axis, keepdims=False):
        return self.sum(axis, keepdims) * (1.0 / self.shape[axis])

    def reshape(self, *shape):
        old = self.shape
        return self._new(self.value.reshape(*shape), ((self, lambda g: g.reshape(old)),))

    def transpose(self, *axes):
        inv = np.argsort(axes)
        return self._new(self.value.transpose(*axes), ((self, lambda g: g.transpose(*inv)),))

    def __getitem__(self, key):
        def vjp(g):
            out = np.zeros_like(self.value)
            out[key] = g
            return out
        return self._new(self.value[key], ((self, vjp),))

    def take(self, idx, axis=0):
        """Rows (or slices along `axis`) by an integer index array; repeats allowed."""
        idx = np.asarray(idx)

        def vjp(g):
            out = np.zeros_like(self.value)
            np.add.at(np.moveaxis(out, axis, 0), idx, np.moveaxis(g, axis, 0))
            return out
        return self._new(np.take(self.value, idx, axis=axis), ((self, vjp),))


def concat(nodes, axis):
    sizes = np.cumsum([n.shape[axis] for n in nodes])[:-1]
    value = np.concatenate([n.value for n in nodes], axis=axis)
    parents = []
    for i, n in enumerate(nodes):
        parents.append((n, (lambda i: lambda g: np.split(g, sizes, axis=axis)[i])(i)))
    return nodes[0]._new(value, tuple(parents))


def index_add(rows, idx, n):
    """out[n, ...] with out[idx[i]] += rows[i]."""
    value = np.zeros((n,) + rows.shape[1:])
    np.add.at(value, idx, rows.value)
    return rows._new(value, ((rows, lambda g: g[idx]),))


# ---- the model ----

def rmsnorm(x, w):
    ms = (x * x).mean(axis=-1, keepdims=True)
    return x * (ms + NORM_EPS) ** -0.5 * w


def linear(x, w):
    """y = x Wᵀ with W stored [out, in]."""
    return x @ w.transpose(1, 0)


def rope(x, positions, theta):
    """x [L, heads, D]; dimension i pairs with i + D/2, angle pos * theta^(-2i/D)."""
    D = x.shape[-1]
    half = D // 2
    inv = theta ** (-2.0 * np.arange(half) / D)
    ang = np.asarray(positions, dtype=np.float64)[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    a, b = x[:, :, :half], x[:, :, half:]
    return concat([a * c - b * s, a * s + b * c], axis=2)


def softmax_rows(z, mask=None):
    """Softmax over the last axis; mask (bool, z's shape): the entries that count."""
    if mask is not None:
        z = z + np.where(mask, 0.0, -np.inf)
    m = z.value.max(axis=-1, keepdims=True)  # a constant shift: softmax does not depend on it
    e = (z - m).exp()
    return e / e.sum(axis=-1, keepdims=True)


def logsumexp_rows(z):
    m = z.value.max(axis=-1, keepdims=True)
    return ((z - m).exp().sum(axis=-1, keepdims=True).log() + m).reshape(z.shape[0])


def attention(h, P, cfg, layer, positions):
    """One sample: h [L, d] -> [L, d] (the attention branch, without the residual)."""
    L = h.shape[0]
    H, Hkv = cfg["n_heads"], cfg["n_kv_heads"]
    D = cfg["d_model"] // H
    pre = "layers.%d.attn." % layer
    q = rope(linear(h, P[pre + "wq"]).reshape(L, H, D), positions, cfg["rope_theta"])
    k = rope(linear(h, P[pre + "wk"]).reshape(L, Hkv, D), positions, cfg["rope_theta"])
    v = linear(h, P[pre + "wv"]).reshape(L, Hkv, D)
    kv_of = np.arange(H) // (H // Hkv)
    qh = q.transpose(1, 0, 2)                       # [H, L, D]
    kh = k.transpose(1, 0, 2).take(kv_of, axis=0)   # [H, L, D]
    vh = v.transpose(1, 0, 2).take(kv_of, axis=0)
    scores = (qh @ kh.transpose(0, 2, 1)) * (1.0 / math.sqrt(D))
    pos = np.asarray(positions)
    mask = np.broadcast_to(pos[None, :] <= pos[:, None], (H, L, L))
    o = (softmax_rows(scores, mask) @ vh).transpose(1, 0, 2).reshape(L, H * D)
    return linear(o, P[pre + "wo"])


def swiglu(x, wg, wu, wd):
    g = linear(x, wg)
    return linear(g * g.sigmoid() * linear(x, wu), wd)


def top_k(scores, k):
    """Indices of the k largest per row, best first; ties to the lower index."""
    order = np.argsort(-scores, axis=1, kind="stable")
    return order[:, :k]


class MoEStats:
    def __init__(self):
        self.aux = None      # Node, sum over samples of this call
        self.z = None
        self.tokens = None   # copies per expert
        self.margin = math.inf  # smallest gap between the k-th and (k+1)-th choice


def moe(h, P, cfg, layer, n_samples, bias):
    """h [T, d] of n_samples samples of equal length -> [T, d], and the losses."""
    T = h.shape[0]
    E, k = cfg["n_experts"], cfg["top_k"]
    pre = "layers.%d.moe." % layer
    logits = linear(h, P[pre + "router"])
    sigmoid = cfg["router"] == "sigmoid_bias"
    p = logits.sigmoid() if sigmoid else softmax_rows(logits)
    select = p.value + (bias[None, :] if sigmoid else 0.0)
    chosen = top_k(select, k)
    st = MoEStats()
    if E > k:
        srt = np.sort(select, axis=1)[:, ::-1]
        st.margin = float(np.min(srt[:, k - 1] - srt[:, k]))
    flat = (np.arange(T)[:, None] * E + chosen).reshape(-1)
    pc = p.reshape(T * E).take(flat).reshape(T, k)
    w = pc / pc.sum(axis=1, keepdims=True) if cfg["norm_topk"] else pc
    wflat = w.reshape(T * k)
    out = None
    for e in range(E):
        slots = np.nonzero(chosen.reshape(-1) == e)[0]
        if len(slots) == 0:
            continue
        tokens = slots // k
        y = swiglu(h.take(tokens), P[pre + "experts.%d.w_gate" % e],
                   P[pre + "experts.%d.w_up" % e], P[pre + "experts.%d.w_down" % e])
        y = y * wflat.take(slots).reshape(len(slots), 1)
        part = index_add(y, tokens, T)
        out = part if out is None else out + part
    st.tokens = np.bincount(chosen.reshape(-1), minlength=E)
    # Switch loss per sample: coef * E * sum_i f_i * mean_t q_ti, f (the routed
    # share) a constant; z-loss: coef * mean_t logsumexp(logits_t)^2.
    q = p / p.sum(axis=1, keepdims=True) if sigmoid else p
    L = T // n_samples
    lse = logsumexp_rows(logits)
    for s in range(n_samples):
        rows = np.arange(s * L, (s + 1) * L)
        f = np.bincount(chosen[rows].reshape(-1), minlength=E) / float(L * k)
        aux_s = (q.take(rows).mean(axis=0) * f).sum() * (cfg["aux_loss_coef"] * E)
        lt = lse.take(rows)
        z_s = (lt * lt).mean(axis=0) * cfg["z_loss_coef"]
        st.aux = aux_s if st.aux is None else st.aux + aux_s
        st.z = z_s if st.z is None else st.z + z_s
    return out, st


def is_moe_layer(cfg, layer):
    return cfg["n_experts"] > 0 and layer % cfg["moe_every"] == cfg["moe_every"] - 1


def cross_entropy_sum(logits, targets):
    T = logits.shape[0]
    lse = logsumexp_rows(logits)
    picked = logits.reshape(-1).take(np.arange(T) * logits.shape[1] + targets)
    return (lse - picked).sum()


def forward_microbatch(P, cfg, tokens, targets, biases):
    """tokens, targets [n_samples, L]: (CE sum, aux sum, z sum, routing stats per MoE layer)."""
    S, L = tokens.shape
    positions = np.arange(L)
    x = P["embedding"].take(tokens.reshape(-1))
    stats = []
    for layer in range(cfg["n_layers"]):
        pre = "layers.%d." % layer
        h = rmsnorm(x, P[pre + "attn.norm"])
        parts = [attention(h[s * L:(s + 1) * L], P, cfg, layer, positions) for s in range(S)]
        x = x + concat(parts, axis=0)
        h = rmsnorm(x, P[pre + "ffn_norm"])
        if is_moe_layer(cfg, layer):
            y, st = moe(h, P, cfg, layer, S, biases.get(layer))
            stats.append((layer, st))
        else:
            y = swiglu(h, P[pre + "ffn.w_gate"], P[pre + "ffn.w_up"], P[pre + "ffn.w_down"])
        x = x + y
    logits = linear(rmsnorm(x, P["final_norm"]), P["lm_head"])
    return cross_entropy_sum(logits, targets.reshape(-1)), stats


def decays(name):
    """Weight decay applies to the weight matrices, not to the embedding nor the norms."""
    return not (name == "embedding" or name.endswith("norm"))


def learning_rate(train, step):
    lr, warm, steps = train["lr"], train["warmup_steps"], train["steps"]
    if warm > 0 and step < warm:
        return lr * (step + 1) / warm
    progress = min(1.0, (step - warm) / max(1, steps - warm))
    lo = lr * train["min_lr_ratio"]
    return lo + (lr - lo) * 0.5 * (1.0 + math.cos(math.pi * progress))


class StepResult:
    pass


def train_step(params, adam_m, adam_v, biases, adam_steps, cfg, train, batch, step):
    """One step from float64 copies of a checkpoint's tensors.

    batch: list of micro-batches (tokens, targets), each [micro_batch_size, L].
    biases: {layer: router bias [E]} (sigmoid_bias routers).
    Returns a StepResult with loss, aux_loss, z_loss, grad_norm, lr, clip
    scale, grads, the updated params / moments / biases and per-layer loads.
    """
    n_seq = sum(t.shape[0] for t, _ in batch)
    n_targets = sum(t.size for t, _ in batch)
    grads = {n: np.zeros_like(v) for n, v in params.items()}
    ce_sum = aux_sum = z_sum = 0.0
    loads = {}
    margin = math.inf
    for tokens, targets in batch:
        g = Graph()
        P = {n: g.leaf(v) for n, v in params.items()}
        ce, stats = forward_microbatch(P, cfg, tokens, targets, biases)
        objective = ce * (1.0 / n_targets)
        ce_sum += float(ce.value)
        for layer, st in stats:
            objective = objective + (st.aux + st.z) * (1.0 / n_seq)
            aux_sum += float(st.aux.value)
            z_sum += float(st.z.value)
            loads[layer] = loads.get(layer, 0) + st.tokens
            margin = min(margin, st.margin)
        g.backward(objective)
        for n, node in P.items():
            if node.grad is not None:
                grads[n] += node.grad
    r = StepResult()
    r.loss, r.aux_loss, r.z_loss = ce_sum / n_targets, aux_sum / n_seq, z_sum / n_seq
    r.grads, r.loads, r.routing_margin = grads, loads, margin
    r.grad_norm = math.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))
    r.lr = learning_rate(train, step)
    clip = train["grad_clip"]
    r.clip_scale = clip / (r.grad_norm + 1e-6) if clip > 0 and r.grad_norm > clip else 1.0
    t = adam_steps + 1
    b1, b2, eps, wd = train["beta1"], train["beta2"], train["eps"], train["weight_decay"]
    r.params, r.adam_m, r.adam_v = {}, {}, {}
    for n, p in params.items():
        g = grads[n] * r.clip_scale
        m = b1 * adam_m[n] + (1 - b1) * g
        v = b2 * adam_v[n] + (1 - b2) * g * g
        mhat, vhat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        new = p * (1 - r.lr * wd) if decays(n) else p.copy()
        r.params[n] = new - r.lr * mhat / (np.sqrt(vhat) + eps)
        r.adam_m[n], r.adam_v[n] = m, v
    r.biases = {}
    for layer, b in biases.items():
        load = loads[layer].astype(np.float64)
        r.biases[layer] = b + cfg["router_bias_rate"] * np.sign(load.mean() - load)
    return r
