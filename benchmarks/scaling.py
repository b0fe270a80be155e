"""Weak scaling of the DAG engine on this machine: W = 1, 2, 4 workers with a fixed batch per
worker, for text GRPO (``llm_grpo``, the tiny Qwen2 model) and embodied SRPO (``embodied_srpo``,
robosuite Lift, MLP policy).

Each (workload, W) trains ``--steps`` steps through ``vla-rl train`` (one subprocess each: its
own Ray, on loopback), with the global batch ``W`` times the per-worker one, one minibatch per
epoch, no held-out evaluation. From the run's ``metrics.jsonl``, for the steps after the first
(start-up effects), it reports:

- step time (median), the driver's wall time per step;
- bytes sent and received per worker per step (``comm/bytes_sent``, ``comm/bytes_received``: a
  mean over the workers; ``comm/bytes_received_max``: the busiest worker), as the project's
  collective helpers count them (:mod:`vla_rl.utils.collectives`: ring all-gather and all-reduce,
  direct all-to-all), by tag (rows re-sharded, re-shard metadata, metrics, SRPO's reference set,
  ...). The gradient all-reduces inside DDP are not counted (see docs/scaling.md for their formula);
- collectives per step (``comm/collectives``);
- bytes that reached the Ray driver per step (``driver/bytes``: the pickled replies of every
  worker: rank 0's metrics and an empty reply from each other worker);
- ``vla-rl plan``'s estimate of the re-shard bytes per worker (:mod:`vla_rl.dag.traffic`).

The machine has 2 cores: at W = 4 the workers and their simulator actors share them, so step
times do not show scaling (they grow with W); the bytes and collectives per worker are the point.

    flock /tmp/vla_heavy.lock python benchmarks/scaling.py --out benchmarks/scaling.json
    python benchmarks/scaling.py --tiny --out /tmp/scaling_tiny.json   # W = 1, 2; one step of llm_grpo
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's vla_rl, as the training subprocesses get it

WORKLOADS = {
    "llm_grpo": ("llm_grpo", []),
    "embodied_srpo": ("embodied_srpo", []),
    # For contrast (and to check vla-rl plan's estimates against the counters: a DP-size change moves
    # every row): the advantage node at DP 1, which gathers the whole step's batch onto every worker.
    "llm_grpo_advantage_dp1": ("llm_grpo", ["nodes.advantage.dp_size=1"]),
}
"""Workload name -> (template, extra overrides)."""


def overrides_for(workload: str, workers: int, args, work: Path) -> list[str]:
    """The workload's overrides at ``workers`` workers: the per-worker batch times ``workers``."""
    template, extra = WORKLOADS[workload]
    common = [*extra, f"workers.num_workers={workers}", f"trainer.total_steps={args.steps}", "trainer.ppo_epochs=1",
              f"trainer.save_every={args.steps}", "eval.num_episodes=0", f"run.output_dir={work}",
              f"run.name={workload}_w{workers}", f"run.seed={args.seed}"]
    if args.keep_all_groups:
        common.append("algorithm.filter_groups.zero_variance=false" if template == "llm_grpo"
                      else "algorithm.filter_groups.success_rate_band=null")
    if template == "llm_grpo":
        prompts = args.prompts_per_worker * workers
        return [*common, f"text.prompts_per_step={prompts}", f"data.group_size={args.text_group_size}",
                f"trainer.ppo_mini_batch_size={prompts * args.text_group_size}",
                f"text.max_response_length={args.response_length}", f"text.sft_steps={args.sft_steps}",
                "text.num_generated_train=2000", "text.num_generated_test=16"]
    states = args.states_per_worker * workers
    return [*common, f"data.init_states_per_step={states}", f"data.group_size={args.embodied_group_size}",
            f"trainer.ppo_mini_batch_size={states * args.embodied_group_size}",
            f"simulator.env.horizon={args.horizon}", f"warm_start.num_demos={args.demos}",
            *([f"warm_start.bc_steps={args.bc_steps}", f"warm_start.demo_store={work / 'demos.zarr'}"]
              if args.demos else [])]


def planned(template_name: str, overrides: list[str], workers: int) -> dict:
    """``vla-rl plan``'s estimate for the training step's data hops (per worker, per step)."""
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.planner import plan
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.dag.traffic import estimate_traffic

    template = load_template(template_name, overrides)
    shape = WORKFLOWS.get(template.config.run.workflow).step_shape(template.config)
    hops = estimate_traffic(plan(template, workers), shape)
    return {
        "hops": [{"src": h.src, "dst": h.dst, "dp": [h.src_dp_size, h.dst_dp_size], "rebalance": h.rebalance,
                  "keys": list(h.keys), "row_bytes": h.row_bytes, "rows": h.rows,
                  "rows_bytes_per_worker": h.bytes_per_worker,
                  "rebalance_bound_per_worker": h.rebalance_bound_per_worker if h.rebalance else 0,
                  "meta_bytes_per_worker": h.meta_bytes_per_worker} for h in hops],
        "rows_bytes_per_worker": sum(h.bytes_per_worker for h in hops),
        "meta_bytes_per_worker": sum(h.meta_bytes_per_worker for h in hops),
        "samples_per_step": shape.samples,
    }


def run_one(workload: str, workers: int, args, work: Path) -> dict:
    """Train one (workload, W) in a subprocess and summarise its steps after the first."""
    overrides = overrides_for(workload, workers, args, work)
    template = WORKLOADS[workload][0]
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    log = work / f"{workload}_w{workers}.log"
    with log.open("w") as out:
        status = subprocess.run([sys.executable, "-m", "vla_rl.cli", "train", template, *overrides], cwd=ROOT,
                                env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise RuntimeError(f"{workload} at W={workers} failed (status {status}); log: {log}\n"
                           + "\n".join(log.read_text().splitlines()[-30:]))
    records = [json.loads(line) for line in (work / f"{workload}_w{workers}" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing/step" in r]
    measured = steps[1:] if len(steps) > 1 else steps

    def avg(key: str) -> float:
        return statistics.fmean(r.get(key, 0.0) for r in measured)

    tags = sorted({key.split("/")[1] for r in measured for key in r
                   if key.startswith("comm/") and key.count("/") == 2})
    return {
        "workload": workload, "workers": workers, "steps_measured": len(measured),
        "template": template, "overrides": WORKLOADS[workload][1],
        "samples_per_worker": (args.prompts_per_worker * args.text_group_size if template == "llm_grpo"
                               else args.states_per_worker * args.embodied_group_size),
        "step_s_median": statistics.median(r["timing/step"] for r in measured),
        "bytes_sent_per_worker": avg("comm/bytes_sent"),
        "bytes_received_per_worker": avg("comm/bytes_received"),
        "bytes_received_max": max(r.get("comm/bytes_received_max", 0.0) for r in measured),
        "collectives": avg("comm/collectives"),
        "driver_bytes": avg("driver/bytes"),
        "by_tag": {tag: {"bytes_received": avg(f"comm/{tag}/bytes_received"),
                         "collectives": avg(f"comm/{tag}/collectives")} for tag in tags},
        "success_rate": avg("rollout/success_rate"),
        "kept_fraction": avg("filter/kept_fraction"),
        "planned": planned(template, overrides, workers),
        "wall_s": time.perf_counter() - started,
        "steps": [{k: v for k, v in r.items() if k.startswith(("comm/", "driver/", "timing/step", "rollout/success"))}
                  for r in steps],
    }


def print_table(runs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    from vla_rl.dag.traffic import format_bytes

    table = Table(title="weak scaling, fixed batch per worker: per worker and step (means over the measured steps)")
    columns = ("workload", "W", "samples/w", "step s", "sent", "received", "max recv", "coll.", "driver",
               "rows", "rows plan", "reshard meta", "metrics", "SRPO ref", "counts")
    for column in columns:
        table.add_column(column, justify="left" if column == "workload" else "right", no_wrap=True)
    for r in runs:
        tag = {name: counts["bytes_received"] for name, counts in r["by_tag"].items()}
        table.add_row(r["workload"], str(r["workers"]), str(r["samples_per_worker"]), f"{r['step_s_median']:.2f}",
                      format_bytes(r["bytes_sent_per_worker"]), format_bytes(r["bytes_received_per_worker"]),
                      format_bytes(r["bytes_received_max"]), f"{r['collectives']:.0f}",
                      format_bytes(r["driver_bytes"]), format_bytes(tag.get("reshard_rows", 0.0)),
                      format_bytes(r["planned"]["rows_bytes_per_worker"]), format_bytes(tag.get("reshard_meta", 0.0)),
                      format_bytes(tag.get("metrics", 0.0)), format_bytes(tag.get("srpo_reference", 0.0)),
                      format_bytes(tag.get("summaries", 0.0)))
    Console(width=190).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2, 4])
    parser.add_argument("--steps", type=int, default=4, help="training steps per run (the first is not measured)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts-per-worker", type=int, default=4)
    parser.add_argument("--text-group-size", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=300,
                        help="supervised warm start of the tiny LM (some groups then hold right and wrong answers)")
    parser.add_argument("--response-length", type=int, default=24, help="the generated arithmetic answers need 24")
    parser.add_argument("--states-per-worker", type=int, default=1)
    parser.add_argument("--embodied-group-size", type=int, default=4)
    parser.add_argument("--horizon", type=int, default=80, help="control steps per episode (embodied)")
    parser.add_argument("--demos", type=int, default=2, help="scripted demonstrations of the warm start")
    parser.add_argument("--bc-steps", type=int, default=1500, help="behaviour-cloning steps of the warm start")
    parser.add_argument("--keep-all-groups", action="store_true",
                        help="no group filter: the shards stay equal and the rebalance before the update moves nothing")
    parser.add_argument("--tiny", action="store_true",
                        help="a smoke test: llm_grpo_advantage_dp1 at W = 1, 2, 2 steps, tiny batches, all groups kept")
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON record there (default: none; the tables are printed)")
    args = parser.parse_args()
    if args.tiny:
        args.workloads, args.workers, args.steps, args.keep_all_groups = ["llm_grpo_advantage_dp1"], [1, 2], 2, True
        args.prompts_per_worker, args.text_group_size, args.sft_steps = 2, 2, 20

    runs = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for workload in args.workloads:
            for workers in args.workers:
                runs.append(run_one(workload, workers, args, Path(tmp)))
                print(f"{workload} W={workers}: {runs[-1]['wall_s']:.0f} s", flush=True)
    print_table(runs)
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {"settings": settings, "cores": os.cpu_count(), "total_s": time.perf_counter() - started, "runs": runs}
    if args.out is None:
        print("no JSON record written (give --out FILE to keep one)")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
