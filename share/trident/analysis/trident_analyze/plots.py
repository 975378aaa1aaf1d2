"""`trident-analyze plot`: PNG figures from a run file.

loss.png        loss and learning rate over steps
pipeline.png    Gantt chart of one step's timeline (row per rank, F/B/W coloured,
                micro-batch numbers in the boxes, as in the pipeline papers)
cp_balance.png  attention compute per rank (zig-zag balance), from ATTN events
experts.png     expert-load heatmap (step x expert, per MoE layer) and imbalance
comm.png        communication volume per kind per step
"""
from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .runfile import COMM_KINDS, AnalysisError, RunFile, decode  # noqa: E402
from .summary import event_kinds  # noqa: E402

COLORS = {"F": "#4C8BF5", "B": "#34A853", "W": "#F4B400"}


def save(fig, out: str, name: str) -> str:
    """Lay out, write out/<name>.png, free the figure; returns the path."""
    fig.tight_layout()
    path = os.path.join(out, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_loss(rf: RunFile, out: str) -> str:
    st = rf.steps()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(st["step"], st["loss"], color="#1f77b4", label="loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot(st["step"], st["lr"], color="#ff7f0e", linestyle="--", label="lr")
    ax2.set_ylabel("learning rate")
    ax.set_title("loss and learning rate")
    fig.legend(loc="upper right")
    return save(fig, out, "loss")


def pick_step(ev, step):
    steps = np.unique(ev["step"])
    if step is None:
        # the last step is the steady one; the first includes start-up
        return int(steps[-1])
    if step not in steps:
        raise AnalysisError(f"step {step} is not in the timeline (steps {int(steps[0])}..{int(steps[-1])})")
    return step


def plot_pipeline(rf: RunFile, out: str, step=None) -> str:
    ev = rf.events()
    kinds = event_kinds(ev)
    sel = np.isin(kinds, list(COLORS))
    if not sel.any():
        raise AnalysisError(f"{rf.path}: the timeline holds no F/B/W events")
    step = pick_step(ev[sel], step)
    sel &= ev["step"] == step
    t0 = ev["t_begin_s"][sel].min()
    ranks = sorted(set(int(r) for r in ev["rank"][sel]))
    fig, ax = plt.subplots(figsize=(max(8, 1.0 * sel.sum() / max(len(ranks), 1)), 0.6 * len(ranks) + 1.5))
    for i in np.nonzero(sel)[0]:
        r = int(ev["rank"][i])
        b = (ev["t_begin_s"][i] - t0) * 1e3
        w = (ev["t_end_s"][i] - ev["t_begin_s"][i]) * 1e3
        k = kinds[i]
        ax.barh(ranks.index(r), w, left=b, color=COLORS[k], edgecolor="black", linewidth=0.4)
        ax.text(b + w / 2, ranks.index(r), str(int(ev["microbatch"][i])), ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(ranks)))
    ax.set_yticklabels([f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set_xlabel("time in step (ms)")
    ax.set_title(f"pipeline timeline, step {step}")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLORS.values()]
    ax.legend(handles, list(COLORS), loc="upper right", ncol=3, fontsize=8)
    return save(fig, out, "pipeline")


def plot_cp_balance(rf: RunFile, out: str) -> str:
    ev = rf.events()
    kinds = event_kinds(ev)
    sel = np.char.startswith(kinds.astype(str), "ATTN")
    if not sel.any():
        raise AnalysisError(f"{rf.path}: the timeline holds no ATTN events (attention compute per rank)")
    ranks = sorted(set(int(r) for r in ev["rank"][sel]))
    per_rank = [float(np.sum((ev["t_end_s"] - ev["t_begin_s"])[sel & (ev["rank"] == r)])) for r in ranks]
    fig, ax = plt.subplots(figsize=(max(5, 0.6 * len(ranks) + 2), 4))
    ax.bar([str(r) for r in ranks], [1e3 * x for x in per_rank], color="#4C8BF5")
    mx, mn = max(per_rank), min(per_rank)
    ax.set_title(f"attention compute per rank (max/min {mx / mn if mn > 0 else float('inf'):.2f})")
    ax.set_xlabel("rank")
    ax.set_ylabel("ms over the run")
    return save(fig, out, "cp_balance")


def plot_experts(rf: RunFile, out: str) -> str:
    et = rf.expert_tokens()
    if et is None or et.size == 0:
        raise AnalysisError(f"{rf.path}: has no /metrics/expert_tokens (the model has no MoE layers)")
    n_layers = et.shape[1]
    fig, axes = plt.subplots(1, n_layers + 1, figsize=(3.2 * (n_layers + 1), 3.8))
    for layer in range(n_layers):
        ax = axes[layer]
        im = ax.imshow(et[:, layer, :], aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(f"MoE layer {layer}")
        ax.set_xlabel("expert")
        ax.set_ylabel("step")
        fig.colorbar(im, ax=ax, fraction=0.046)
    mean = et.mean(axis=2)
    imb = np.where(mean > 0, et.max(axis=2) / np.maximum(mean, 1e-12), 1.0)
    ax = axes[-1]
    for layer in range(n_layers):
        ax.plot(imb[:, layer], label=f"layer {layer}")
    ax.set_title("imbalance (max/mean)")
    ax.set_xlabel("step")
    ax.legend(fontsize=7)
    return save(fig, out, "experts")


def plot_comm(rf: RunFile, out: str) -> str:
    cb = rf.comm_bytes()
    if cb is None or cb.size == 0:
        raise AnalysisError(f"{rf.path}: has no /metrics/comm_bytes")
    fig, ax = plt.subplots(figsize=(7, 4))
    bottom = np.zeros(cb.shape[0])
    x = np.arange(cb.shape[0])
    for i, k in enumerate(COMM_KINDS):
        ax.bar(x, cb[:, i] / 2**20, bottom=bottom, label=k, width=1.0)
        bottom += cb[:, i] / 2**20
    ax.set_xlabel("step")
    ax.set_ylabel("MB sent (all ranks)")
    ax.set_title("communication volume per kind")
    ax.legend()
    return save(fig, out, "comm")


FIGURES = {
    "loss": plot_loss,
    "pipeline": plot_pipeline,
    "cp_balance": plot_cp_balance,
    "experts": plot_experts,
    "comm": plot_comm,
}


def plot_all(rf: RunFile, out: str, step=None, only=None):
    """Returns ([written paths], [(figure, reason it could not be made)])."""
    os.makedirs(out, exist_ok=True)
    made, missing = [], []
    for name, fn in FIGURES.items():
        if only and name not in only:
            continue
        try:
            made.append(fn(rf, out, step) if name == "pipeline" else fn(rf, out))
        except AnalysisError as e:
            missing.append((name, str(e)))
    return made, missing
