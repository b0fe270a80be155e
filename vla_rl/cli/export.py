"""``vla-rl export`` (a checkpoint's policy in its own model layout) and ``vla-rl
export-episodes`` (stored episodes as a LeRobot dataset)."""

from __future__ import annotations

import argparse

from vla_rl.cli.arguments import positive_float, positive_int


def add_export_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="write a checkpoint's policy in its own model layout (LoRA merged), loadable as a pretrained model",
        description="Verify a training checkpoint (DDP or FSDP-sharded), rebuild the run's policy in this process, "
        "load the checkpoint's weights, merge LoRA adapters and write the policy in its model layout: a Hugging "
        "Face directory for causal LMs (text.model_path), the published OpenVLA(-OFT) layout "
        "(policy.config.model_path), config.json + model.safetensors for the MLP policy.",
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT",
                        help="a checkpoint directory (<run>/checkpoints/step_*) or a run directory (its newest "
                        "complete checkpoint)")
    parser.add_argument("out", metavar="OUT", help="the directory to write (must not exist)")
    parser.add_argument("paths", nargs="*", default=[], metavar="KEY=DIR",  # a default: not listed as required
                        help="where the run's pretrained files are now, if they moved: text.model_path (a text "
                        "run), policy.config.model_path or policy.config.tokenizer_path (an embodied run)")
    parser.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    import logging

    from vla_rl.export import export_checkpoint

    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("vla_rl.export").setLevel(logging.INFO)  # which checkpoint, how many LoRA layers merged
    print(export_checkpoint(args.checkpoint, args.out, args.paths))
    return 0


def add_export_episodes_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export-episodes",
        help="write stored episodes (evaluations, demonstrations) as a LeRobot dataset (format v3.0)",
        description="Replay the episodes of an evaluation directory (vla-rl eval), a run directory (its eval/) or "
        "a demonstration store (demos.zarr) in the simulator, one control step at a time, and write them as a "
        "LeRobot v3.0 dataset: observation.state, action, next.reward/done/success, and with --cameras "
        "observation.images.<camera> videos (AV1, as LeRobot encodes). LeRobot's LeRobotDataset loads it.",
    )
    parser.add_argument("source", metavar="SOURCE", help="an evaluation directory (or its episodes/), a run "
                        "directory, one task of an evaluation (<eval>/episodes/<task>), one evaluation store "
                        "(<eval>/episodes/<task>/rank<r>.zarr) or a demos.zarr")
    parser.add_argument("out", metavar="OUT", help="the dataset root to write (must not exist)")
    parser.add_argument("--cameras", type=_names, default=(), metavar="C1,C2",
                        help="cameras to render as videos (e.g. agentview,robot0_eye_in_hand); default: state only")
    parser.add_argument("--camera-size", type=positive_int, default=None,
                        help="square size in pixels of the --cameras rendered")
    parser.add_argument("--fps", type=positive_float, default=None, help="frames per second (default: the control frequency)")
    parser.add_argument("--greedy-only", action="store_true", help="only the greedy protocol's evaluation episodes")
    parser.add_argument("--robot-type", default=None, help="LeRobot's robot_type (default: the simulator's robot)")
    parser.set_defaults(handler=run_export_episodes)


def _names(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated non-empty names."""
    names = tuple(part.strip() for part in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names such as agentview,robot0_eye_in_hand, "
                                         f"got {text!r}")
    return names


def run_export_episodes(args: argparse.Namespace) -> int:
    import logging

    from vla_rl.export_episodes import export_episodes

    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # not other packages' INFO (PyOpenGL's at exit)
    logging.getLogger("vla_rl.export_episodes").setLevel(logging.INFO)  # each episode written
    print(export_episodes(args.source, args.out, cameras=args.cameras, camera_size=args.camera_size, fps=args.fps,
                          greedy_only=args.greedy_only, robot_type=args.robot_type))
    return 0
