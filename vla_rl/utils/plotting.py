"""Plots people look at after a run (saved as PNG)."""

from __future__ import annotations

from pathlib import Path


def plot_success_curve(records: list[dict], path: Path, title: str) -> bool:
    """Training success rate per step, with the held-out evaluations (before, every
    ``eval.every_steps`` and after training; Wilson 95% intervals) as a second curve.

    Args:
        records: metric records (``step`` plus metrics) as in ``metrics.jsonl``.
        path: PNG file to write (atomically).
        title: figure title.

    Returns:
        Whether the file was written: not when no record holds a success rate (a supervised
        run without evaluation), rather than an empty plot.
    """
    train = [(r["step"], r["rollout/success_rate"]) for r in records if r.get("rollout/success_rate") is not None]
    if not train and not any(r.get(f"eval/{p}/success_rate") is not None for r in records for p in ("greedy", "sampled")):
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if train:
        steps, rates = zip(*train)
        ax.plot(steps, rates, marker=".", label="training rollouts (sampled)")
    for protocol, marker in (("greedy", "s"), ("sampled", "o")):
        key = f"eval/{protocol}/success_rate"
        points = [r for r in records if r.get(key) is not None]
        if points:
            xs = [r["step"] for r in points]
            ys = [r[key] for r in points]
            yerr = [[y - r[f"eval/{protocol}/ci_low"] for y, r in zip(ys, points)],
                    [r[f"eval/{protocol}/ci_high"] - y for y, r in zip(ys, points)]]
            ax.errorbar(xs, ys, yerr=yerr, fmt=f"{marker}-", capsize=4, label=f"held-out eval ({protocol}, 95% CI)")
    ax.set_xlabel("training step")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
    return True


def plot_success_vs_checkpoint(rows: list[dict], path: Path, title: str) -> None:
    """Evaluation success rate per checkpoint, one line per protocol, with Wilson 95% intervals.

    Args:
        rows: ``checkpoint_step``, ``protocol``, ``success_rate``, ``ci_low``, ``ci_high`` each
            (as :func:`vla_rl.evaluation.report.summarize` gives them, for one task or overall).
        path: PNG file to write (atomically).
        title: figure title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        points = sorted((r for r in rows if r["protocol"] == protocol), key=lambda r: r["checkpoint_step"])
        xs = [r["checkpoint_step"] for r in points]
        ys = [r["success_rate"] for r in points]
        yerr = [[y - r["ci_low"] for y, r in zip(ys, points)], [r["ci_high"] - y for y, r in zip(ys, points)]]
        ax.errorbar(xs, ys, yerr=yerr, marker="o", capsize=4, label=f"{protocol} (95% CI)")
    ax.set_xticks(sorted({r["checkpoint_step"] for r in rows}))
    ax.set_xlabel("checkpoint (training step)")
    ax.set_ylabel("success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(loc="lower right")
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
