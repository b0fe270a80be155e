"""``vla-rl export CHECKPOINT OUT [KEY=DIR ...]``: a training checkpoint (or a run directory's newest) as the
policy's own model directory.

The checkpoint is verified against its manifest first (:func:`~vla_rl.checkpoints.integrity.verify_checkpoint`).
The run's policy is rebuilt in this process from the run's resolved template (and the overrides
of its resumes), on the CPU, without Ray, workers or simulator actors (an embodied run's
observation and action sizes come from one environment of its simulator); the checkpoint's
weights are loaded into it whichever strategy wrote them (``model.safetensors`` under DDP; the
sharded ``actor_sharded/`` of FSDP, read with torch.distributed.checkpoint in this one process);
LoRA adapters are merged into their base weights; then the policy writes its own layout:

- the text workflow's causal LM: a Hugging Face directory (``config.json``, ``model.safetensors``,
  tokenizer files), loadable as ``text.model_path``;
- OpenVLA / OpenVLA-OFT: the published Prismatic layout (``config.json``, safetensors,
  ``dataset_statistics.json``, tokenizer; OFT's head modules as ``<module>--checkpoint.pt``),
  loadable as ``policy.config.model_path``;
- π0: a π0 checkpoint directory (LeRobot's ``model.safetensors`` names, ``pi0_architecture.json``,
  the statistics as openpi's ``norm_stats.json``, tokenizer; Flow-Noise's noise head as
  ``pi0_noise_head.safetensors``), loadable as ``policy.config.model_path`` (π0 has no LoRA);
- the MLP policy: ``config.json`` + ``model.safetensors``, loadable with ``MLPPolicy.from_pretrained``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from vla_rl_core.file_modes import uncreatable

logger = logging.getLogger(__name__)


class ExportError(ValueError):
    """What ``vla-rl export`` was given cannot be exported (reported in one line, exit 2)."""


class PolicyNotBuilt(ExportError):
    """The run's policy cannot be rebuilt from its settings (its pretrained model or tokenizer
    moved or changed). ``reason``: why; ``settings``: the ``KEY=DIR`` settings that would say
    where it is now; ``checkpoint``: the checkpoint being loaded."""

    def __init__(self, reason: str, settings: Sequence[str], checkpoint: Path) -> None:
        self.reason, self.settings, self.checkpoint = reason, tuple(settings), checkpoint
        super().__init__(f"the run's policy cannot be built: {reason} (moved? give its new place: vla-rl export "
                         f"{checkpoint} OUT {' or '.join(f'{key}=DIR' for key in self.settings)})")


class OtherWorkflow(ExportError):
    """The checkpoint is of a run of another workflow than the one asked for. ``workflow``: the run's."""

    def __init__(self, checkpoint: Path, workflow: str, wanted: str) -> None:
        self.checkpoint, self.workflow = checkpoint, workflow
        super().__init__(f"{checkpoint} is a checkpoint of a {workflow} run, not of an {wanted} one")


#: The settings ``vla-rl export`` takes (``KEY=DIR``), by workflow: where the run's pretrained
#: files are now, when they moved since it trained. The weights come from the checkpoint, so that a
#: setting that changed the policy would not fit them.
PATH_SETTINGS = {"text": ("text.model_path",),
                 "embodied": ("policy.config.model_path", "policy.config.tokenizer_path")}


def _run_setting(config, key: str):
    """The run's value of a :data:`PATH_SETTINGS` key (None where it has none: an ``architecture``
    policy, the MLP, a text run's in-process tiny model)."""
    section, _, name = key.rpartition(".")
    owner = config.policy.policy_config() if section == "policy.config" else config.text
    return getattr(owner, name, None)


def export_checkpoint(checkpoint: str | Path, out: str | Path, paths: Sequence[str] = ()) -> Path:
    """Write the policy of training checkpoint ``checkpoint`` to the new directory ``out``.

    Args:
        checkpoint: a checkpoint directory ``<run>/checkpoints/step_<8-digit step>`` of
            ``vla-rl train`` (e.g. ``step_00000010``), or a run directory: its newest complete
            checkpoint.
        out: the directory to create.
        paths: ``KEY=DIR`` settings of :data:`PATH_SETTINGS` (the run's workflow's) replacing the
            run's (its pretrained model or tokenizer moved).

    Returns:
        ``out``.

    Raises:
        ExportError: ``checkpoint`` is not a checkpoint of a run directory (nor a run directory
            with one), fails verification (missing, truncated or altered files: the message
            names them), holds no policy weights, ``out`` exists or cannot be created (a file on
            its path), or the policy's published layout cannot hold it (its ``save_pretrained``
            refuses).
    """
    checkpoint_dir(checkpoint)  # before OUT: `vla-rl export episodes RUN OUT` named RUN as existing
    for item in paths:
        if "=" not in item:
            raise ExportError(f"{item!r} is not KEY=DIR: vla-rl export takes CHECKPOINT OUT [KEY=DIR ...] (stored "
                              "episodes: vla-rl export-episodes SOURCE OUT)")
    out = Path(out)
    if out.exists():
        raise ExportError(f"{out} exists; export to a new directory")
    if problem := uncreatable(out):  # before the policy loads
        raise ExportError(f"{out} cannot be created: {problem}")
    policy, _ = load_checkpoint_policy(checkpoint, paths)
    if callable(getattr(policy, "merge_lora", None)):
        merged = policy.merge_lora()
        if merged:
            logger.info("merged the LoRA adapters of %d layers", merged)
    try:
        return Path(policy.save_pretrained(out))
    except ValueError as err:  # what the policy's own layout cannot hold
        raise ExportError(f"{checkpoint}: {err}") from None
    except OSError as err:  # a full disk, a read-only mount: what only the write can tell
        raise ExportError(f"{out} cannot be written: {err.strerror or err}") from None


def checkpoint_dir(checkpoint: str | Path) -> Path:
    """``checkpoint`` resolved, an existing directory.

    Raises:
        ExportError: it does not exist or is a file (``episodes``: pointing to ``vla-rl
            export-episodes``).
    """
    path = Path(checkpoint).resolve()
    if not path.is_dir():
        hint = " (stored episodes: vla-rl export-episodes SOURCE OUT)" if path.name == "episodes" else ""
        raise ExportError(f"checkpoint {path} {'is a file' if path.exists() else 'does not exist'}: name a checkpoint "
                          f"directory or a run directory{hint}")
    return path


def load_checkpoint_policy(checkpoint: str | Path, paths: Sequence[str] = (), workflow: str | None = None):
    """The policy of training checkpoint ``checkpoint``, rebuilt on the CPU from its run's resolved
    template (and the overrides of its resumes) with the checkpoint's weights loaded (``vla-rl
    export`` and ``vla-rl serve``).

    Args:
        checkpoint: a checkpoint directory ``<run>/checkpoints/step_<8-digit step>`` of
            ``vla-rl train`` (e.g. ``step_00000010``), or a run directory: its newest complete
            checkpoint.
        paths: ``KEY=DIR`` settings of :data:`PATH_SETTINGS` (the run's workflow's) replacing the run's.
        workflow: the run's workflow must be this one (``"embodied"``), checked before the policy
            loads; None: any.

    Returns:
        ``(policy, config)``: the :class:`policies.base.Policy` (LoRA adapters not merged) and the
        run's validated config.

    Raises:
        ExportError: ``checkpoint`` is not a checkpoint of a run directory (nor a run directory
            with one), fails verification
            (missing, truncated or altered files: the message names them), holds no policy
            weights, or a setting of ``paths`` is not one of :data:`PATH_SETTINGS`;
            :class:`OtherWorkflow`: the run is not of ``workflow``;
            :class:`PolicyNotBuilt`: the run's policy cannot be built (its pretrained model moved).
    """
    from vla_rl.checkpoints import files as ckpt
    from vla_rl.checkpoints.integrity import verify_checkpoint
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE, CheckpointCorruptError
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.run_dir import RunDirectory, RunDirError, absolute

    path = checkpoint_dir(checkpoint)
    try:
        path = ckpt.run_checkpoint(path)
    except FileNotFoundError as err:
        raise ExportError(str(err)) from err
    if path != Path(checkpoint).resolve():
        logger.info("exporting the run's newest complete checkpoint, %s", path)
    if not (path / TRAINER_STATE_FILE).is_file():
        raise ExportError(f"{path} is not a complete checkpoint directory (no {TRAINER_STATE_FILE}); name one "
                          "such as outputs/<run>/checkpoints/step_00000010, or its run directory")
    try:
        verify_checkpoint(path)
    except CheckpointCorruptError as err:
        raise ExportError(str(err)) from err
    run_dir = path.parent.parent
    try:
        run = RunDirectory.reopen(run_dir)
    except RunDirError as err:
        raise ExportError(f"{path} does not sit in a run directory written by vla-rl train ({err})") from err
    config = load_template(run.template_path, recorded=run.recorded_overrides()).config
    if workflow is not None and config.run.workflow != workflow:
        raise OtherWorkflow(path, config.run.workflow, workflow)
    settings = PATH_SETTINGS[config.run.workflow]
    given = []
    for item in paths:
        key, sep, value = item.partition("=")
        if not sep or key not in settings or not value:
            raise ExportError(f"{item!r}: the export of a {config.run.workflow} run takes only "
                              f"{' and '.join(settings)} as KEY=DIR (where the run's pretrained files are now: the "
                              "weights are the checkpoint's)")
        if _run_setting(config, key) is None:
            raise ExportError(f"{item!r}: the run read no {key} (its policy was built without pretrained files from "
                              "there): export it without this KEY=DIR")
        given.append(f"{key}={json.dumps(str(absolute(value)), ensure_ascii=False)}")  # as a run stores them
    if given:
        config = load_template(run.template_path, given, recorded=run.recorded_overrides()).config
    try:
        policy = WORKFLOWS.get(config.run.workflow).standalone_policy(config, run_dir)
    except (OSError, ValueError) as err:  # its pretrained model or tokenizer moved or changed
        raise PolicyNotBuilt(str(err), settings, path) from None
    try:
        ckpt.load_policy_weights(path, policy)
    except FileNotFoundError as err:
        raise ExportError(f"{path} holds no policy weights: {err}") from err
    except RuntimeError as err:
        raise ExportError(f"{path}: {err}") from err
    return policy, config
