"""The names of everything a run directory holds, in one place.

A training run's directory (``<run.output_dir>/<run.name>``, :class:`vla_rl.run_dir.RunDirectory`)::

    template.yaml        the template as the run started (a resume never rewrites it)
    resumes.jsonl        one JSON record per resume: its overrides, applied in order
    hosts.jsonl          one JSON record per start of the run's workers: the machine of each rank
    .lock                flock held by the run's owner; its text is the owner's pid
    metrics.jsonl        one JSON record per step and per evaluation
    summary.json         the run's final figures (written once it ends)
    success_rate.png     training and held-out success against the step
    tensorboard/         the same metrics for TensorBoard
    checkpoints/         step_XXXXXXXX/ directories and ``latest`` (vla_rl.checkpoints.layout)
    demos.zarr           the warm start's demonstrations (unless warm_start.demo_store names a store)
    eval/                what ``vla-rl eval`` writes for a run: episodes/, videos/, results/
    episodes/, videos/   an evaluation's episode stores and videos (under eval/ or its own directory)
    results/             an evaluation's per-task tables

A seed sweep's directory (:mod:`vla_rl.sweep`) holds one such run directory per seed
(``seed_<S>/``) and ``sweep.json`` (its template, overrides and seeds).
Standard library only.
"""

from __future__ import annotations

from pathlib import Path

RUN_TEMPLATE = "template.yaml"
RESUMES_FILE = "resumes.jsonl"
HOSTS_FILE = "hosts.jsonl"
LOCK_FILE = ".lock"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SUCCESS_PLOT = "success_rate.png"
TENSORBOARD_DIR = "tensorboard"
CHECKPOINTS_DIR = "checkpoints"
DEMO_STORE = "demos.zarr"
EVAL_DIR = "eval"
EPISODES_DIR = "episodes"
VIDEOS_DIR = "videos"
RESULTS_DIR = "results"
SWEEP_FILE = "sweep.json"


def demo_store_path(demo_store: str | None, run_dir: Path) -> Path:
    """Where a run's demonstrations live: ``demo_store`` (``warm_start.demo_store``) if set, else
    ``<run_dir>/demos.zarr``."""
    return Path(demo_store) if demo_store else Path(run_dir) / DEMO_STORE
