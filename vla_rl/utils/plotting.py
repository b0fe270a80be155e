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
        ax.plot(steps, rates, marker=".", label="training rollouts (sampled; before the step's update)")
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
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)  # below: it hid curves
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
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
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)  # below: it hid curves
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    tmp.replace(path)


def evaluation_points(records: list[dict], x_of_step: dict[int, float]) -> dict:
    """A run's greedy held-out evaluations, ``{key: (x, success rate)}``: ``key`` is the step of
    each evaluation, but ``"final"`` for the last one after step 0 (runs stopped by an
    environment-step budget end at different steps); ``x`` from ``x_of_step``."""
    points = {r["step"]: (x_of_step[r["step"]], r["eval/greedy/success_rate"]) for r in records
              if r.get("eval/greedy/success_rate") is not None and r["step"] in x_of_step}
    last = max(points, default=0)
    return {("final" if step == last and step > 0 else step): point for step, point in points.items()}


def held_out_mean(evals: list[dict]) -> list[tuple[float, float, float, float]]:
    """The mean over runs of the evaluations every run has (same key of :func:`evaluation_points`),
    ``[(mean x, mean success rate, low, high)]`` in order of ``x``, with the two-sided 95% Student
    t interval of the mean over the runs (:func:`~vla_rl.utils.stats.mean_interval`, clipped to
    [0, 1]); ``[]`` for fewer than two runs."""
    import numpy as np

    from vla_rl.utils.stats import mean_interval

    if len(evals) < 2:
        return []
    shared = set.intersection(*(set(points) for points in evals))
    means = [(float(np.mean([points[key][0] for points in evals])),
              *mean_interval([points[key][1] for points in evals], bounds=(0.0, 1.0))) for key in shared]
    return sorted(means)


def plot_success_vs_env_steps(runs: dict[int, list[dict]], path: Path, title: str) -> None:
    """Training and held-out success of the runs of a seed sweep against environment steps: one
    thin line per seed, their mean thick with its 95% Student t interval over the seeds shaded
    (training: each seed's curve interpolated on a common grid over the environment steps every
    run covers; held-out: the mean of the evaluations that the seeds share, the final ones
    included wherever each run ended, at their mean environment steps). Runs without
    ``rollout/total_env_steps`` (text runs) are drawn against training steps.

    Args:
        runs: ``{seed: metric records}`` (``metrics.jsonl`` of each run).
        path: PNG file to write (atomically).
        title: figure title.
    """
    import matplotlib
    import numpy as np

    from vla_rl.utils.stats import mean_interval

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_env_steps = all(any("rollout/total_env_steps" in r for r in records) for records in runs.values())
    fig, (train_ax, eval_ax) = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
    train_curves, evals = [], []
    for seed, records in runs.items():
        x_of_step = {0: 0.0}
        for r in records:
            if "rollout/total_env_steps" in r or not by_env_steps:
                x_of_step[r["step"]] = float(r["rollout/total_env_steps"]) if by_env_steps else float(r["step"])
        train = [(x_of_step[r["step"]], r["rollout/success_rate"]) for r in records
                 if r.get("rollout/success_rate") is not None]
        if train:
            xs, ys = map(np.asarray, zip(*train))
            line, = train_ax.plot(xs, ys, lw=0.8, alpha=0.6, label=f"seed {seed}")
            train_curves.append((xs, ys))
        points = evaluation_points(records, x_of_step)
        if points:
            xs, ys = zip(*points.values())
            eval_ax.plot(xs, ys, "o-", lw=0.8, alpha=0.6, color=line.get_color() if train else None,
                         label=f"seed {seed}")
            evals.append(points)
    if len(train_curves) > 1:
        grid = np.linspace(max(xs[0] for xs, _ in train_curves), min(xs[-1] for xs, _ in train_curves), 200)
        curves = np.array([np.interp(grid, xs, ys) for xs, ys in train_curves])  # (seeds, 200)
        _, low, high = zip(*(mean_interval(list(column), bounds=(0.0, 1.0)) for column in curves.T))
        train_ax.fill_between(grid, low, high, color="k", alpha=0.12, lw=0, label="95% interval")
        train_ax.plot(grid, curves.mean(axis=0), "k-", lw=2.2, label="mean")
    mean_points = held_out_mean(evals)
    if mean_points:
        xs, means, lows, highs = zip(*mean_points)
        eval_ax.fill_between(xs, lows, highs, color="k", alpha=0.12, lw=0, label="95% interval")
        eval_ax.plot(xs, means, "ks-", lw=2.2, label="mean")
    xlabel = "environment steps" if by_env_steps else "training step"
    for ax, what in ((train_ax, "training rollouts (sampled)"), (eval_ax, "held-out evaluation (greedy)")):
        ax.set_xlabel(xlabel)
        ax.set_title(what)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=8)  # lower right hid the final points of low success rates
    train_ax.set_ylabel("success rate")
    fig.suptitle(title)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.replace(path)
