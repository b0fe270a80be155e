"""``vla-rl eval`` (held-out rollouts of checkpoints) and ``vla-rl compare`` (two seed sweeps,
seed by seed)."""

from __future__ import annotations

import argparse
from pathlib import Path

from vla_rl.cli.arguments import check_no_valueless_override, split_overrides
from vla_rl.evaluation.targets import EvalInputError


def add_eval_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "eval",
        help="evaluate checkpoints with rollouts (the eval_rollout template on the DAG workers)",
        description="Roll out checkpoints (or, with --policy-from, the policy a training template builds before any "
        "training, e.g. a published checkpoint) on a benchmark's tasks under the greedy and/or sampled protocol. "
        "Writes <run>/eval/ (or --output): every episode in zarr, videos, report.md, report.json and a "
        "success-vs-checkpoint plot. Running it again continues an interrupted evaluation (or extends it with "
        "more checkpoints or protocols; one that leaves some out goes to another --output).",
    )
    parser.add_argument(
        "items",
        nargs="*",
        metavar="TARGET|KEY=VALUE",
        help="run directories (all their checkpoints) or checkpoint directories (none with --policy-from), then "
        "dotted overrides of the evaluation template: eval.num_episodes=20, eval.protocols=[greedy], "
        "eval.temperature=0.5, eval.benchmark=robosuite, ~KEY to delete a setting",
    )
    parser.add_argument("--policy-from", default=None, metavar="TEMPLATE",
                        help="instead of checkpoints, evaluate the policy this training template builds, before any "
                        "training: its pretrained weights, e.g. a published checkpoint with "
                        "policy.config.model_path=DIR (default output: outputs/eval_<model directory name>)")
    parser.add_argument("--steps", type=_steps, default=None, metavar="S1,S2",
                        help="evaluate only the checkpoints of these training steps")
    parser.add_argument("--output", default=None, metavar="DIR", help="evaluation directory (default: <run>/eval)")
    parser.add_argument("--template", default="eval_rollout", metavar="TEMPLATE",
                        help="evaluation template (default: eval_rollout)")
    parser.set_defaults(handler=run_eval)


def _steps(text: str) -> list[int]:
    """argparse type: comma-separated non-negative training steps."""
    try:
        steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated steps such as 5,10, got {text!r}") from None
    if any(step < 0 for step in steps):
        raise argparse.ArgumentTypeError(f"steps must be non-negative, got {text!r}")
    return steps


def run_eval(args: argparse.Namespace) -> int:
    from vla_rl.eval_driver import evaluate

    targets, overrides = split_overrides(args.items)
    check_no_valueless_override(targets)
    if not targets and args.policy_from is None:
        raise EvalInputError("name a run directory or checkpoint directory to evaluate (or --policy-from TEMPLATE)")
    evaluate(targets, overrides, steps=args.steps, output=args.output, template=args.template,
             policy_from=args.policy_from)
    return 0


def add_compare_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "compare",
        help="compare two seed sweeps seed by seed (e.g. SRPO vs GRPO at equal environment steps)",
        description="Pair the runs of two seed sweeps (vla-rl train TEMPLATE --seeds ...) by seed and report, per "
        "held-out protocol, each seed's final success in both and the difference B - A, with the mean difference "
        "over the seeds and its 95% Student t interval; and whether the runs cost the same (each seed's "
        "environment steps, and whether both sweeps set the same trainer.total_env_steps and every run reached "
        "it); whether both evaluated the same held-out episodes; and whether they ran on the same kind of machine. "
        "Writes compare.md, compare.json and compare.png.",
    )
    parser.add_argument("sweep_a", metavar="SWEEP_A", help="a sweep directory (or its report.json): the baseline")
    parser.add_argument("sweep_b", metavar="SWEEP_B", help="the sweep compared with it")
    parser.add_argument("--output", default=None, metavar="DIR",
                        help="where to write the comparison (default: compare_<A>_vs_<B> beside SWEEP_A)")
    parser.set_defaults(handler=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from vla_rl.sweep_compare import COMPARE_MD, compare_sweeps

    a, b = Path(args.sweep_a), Path(args.sweep_b)
    names = [(path.parent if path.is_file() else path).resolve().name for path in (a, b)]
    out = Path(args.output) if args.output else (a.parent if a.is_file() else a).resolve().parent / (
        f"compare_{names[0]}_vs_{names[1]}")
    compare_sweeps(a, b, out)
    print((out / COMPARE_MD).read_text(), end="")
    print(f"written to {out}")
    return 0
