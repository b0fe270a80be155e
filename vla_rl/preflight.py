"""Pre-flight checks of a run's input files, on the driver, before Ray starts and before anything
is written to disk.

Without them every bad file shows up in a worker, tens of seconds into a run, as a remote
traceback beside a half-made run directory, and some never show up at all (a model directory
without its tokenizer files trains on empty prompts; weights whose names do not match the
architecture leave it randomly initialised). :func:`preflight` checks what the template names:

- **prompt files** (``text.train_file``, ``text.test_file``; generated ones need no check): the
  file exists and is readable (parquet: magic bytes and footer; JSONL: every line UTF-8 JSON), the
  columns the run reads exist (``prompt``, ``data_source``, ``reward_model.ground_truth``, and
  ``text.sft_response_column`` for supervised warm starts), and every DP shard of each node that
  reads the training file holds at least ``text.prompts_per_step // dp_size`` rows (the test file:
  a row group per worker), from the parquet metadata alone;
- **model checkpoints** (``text.model_path`` / ``text.gguf_file``; ``policy.config.model_path`` of
  the policies that load one, e.g. OpenVLA and OpenVLA-OFT): ``config.json``, a usable tokenizer
  (with a chat template for chat prompts), whole safetensors headers whose tensor names and shapes
  match the architecture built on the ``meta`` device, no pickle weights unless allowed; a GGUF
  file's magic bytes.

A problem is a :class:`PreflightError` naming the config field and the file, which the command
line prints as one line (exit status 2). The checks reuse the loaders' own code
(:class:`~vla_rl.data.prompt_dataset.PromptFile`, :func:`policies.causal_lm.loading.check_pretrained`,
the policies' ``check_pretrained``), so what passes here loads in the workers.
"""

from __future__ import annotations

from pathlib import Path

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import Template
from vla_rl.dag.planner import Plan, RunNode, plan

#: The worker resource through which nodes read the training prompts, sharded at their DP size.
PROMPT_LOADERS = "prompt_loaders"


class PreflightError(TemplateError):
    """An input file of the run that cannot be used. ``field`` is the config field that names it
    (``text.train_file``, ``policy.config.model_path``, ...), ``node`` the node whose layout it
    does not fit (if any); the message starts with the file at fault."""


def preflight(template: Template, world_size: int | None = None) -> None:
    """Check the files the run will read (see the module docstring); touches nothing on disk.

    Args:
        template: a loaded (validated) template.
        world_size: the number of DAG workers (default ``workers.num_workers``).

    Raises:
        PreflightError: the first problem found.
        TemplateError: the template does not plan (see :func:`vla_rl.dag.planner.plan`).
    """
    config = template.config
    the_plan = plan(template, world_size)
    if config.run.workflow == "text":
        _check_prompt_files(config, the_plan)
        if config.text.model_path is not None:
            _check_text_model(config)
    else:
        _check_policy_checkpoint(config)


def _check_prompt_files(config, the_plan: Plan) -> None:
    """``text.train_file`` in every layout a node reads it with, ``text.test_file`` in the
    evaluation's (one shard per worker)."""
    text = config.text
    tasks = [task for phase in the_plan.phases.values() for task in phase.chains[0] if isinstance(task, RunNode)]
    layouts = {}  # dp_size -> the first node reading the training prompts at that size
    for task in tasks:
        if PROMPT_LOADERS in task.resources:
            layouts.setdefault(task.dp_size, task.node_id)
    sft_targets = text.sft_steps > 0 or any(task.role == "data" and task.fn == "sft" for task in tasks)
    if text.train_file is not None:
        _check_prompt_file(text.train_file, "text.train_file", text.prompts_per_step, layouts,
                           extra_columns=(text.sft_response_column,) if sft_targets else ())
    evaluates = "evaluate" in the_plan.phases and config.eval.num_episodes > 0
    if text.test_file is not None:
        _check_prompt_file(text.test_file, "text.test_file", the_plan.world_size,
                           {the_plan.world_size: None} if evaluates else {})


def _check_prompt_file(path: str, field: str, prompts_per_step: int, layouts: dict[int, str | None],
                       extra_columns: tuple[str, ...] = ()) -> None:
    """One prompt file: readable, with the columns, and ``prompts_per_step // dp_size`` rows in
    every shard of each layout (``dp_size -> node``)."""
    from vla_rl.data.prompt_dataset import PromptFile, shard_steps_per_epoch

    try:
        file = PromptFile(path)
        file.validate(extra_columns)
    except (OSError, ValueError) as error:
        raise PreflightError(str(error), field=field) from None
    for dp_size, node in sorted(layouts.items()):
        try:
            shard_steps_per_epoch(file, prompts_per_step, dp_size)
        except ValueError as error:
            raise PreflightError(str(error), node=node, field=field) from None


def _check_text_model(config) -> None:
    """``text.model_path`` (and ``text.gguf_file``) as the text workflow will load it."""
    from policies.causal_lm.loading import check_pretrained

    text = config.text
    field = "text.gguf_file" if text.gguf_file is not None and Path(text.model_path).is_dir() else "text.model_path"
    try:
        check_pretrained(text.model_path, text.gguf_file, text.prompt_format, allow_pickle=text.allow_pickle,
                         allow_partial_load=config.policy.allow_partial_load)
    except (OSError, ValueError) as error:
        raise PreflightError(_with_field_hint(str(error), "text.allow_pickle"), field=field) from None


def _check_policy_checkpoint(config) -> None:
    """``policy.config.model_path`` of a policy that loads a pretrained checkpoint (its class
    defines ``check_pretrained``, as :class:`~policies.openvla.policy_base.PrismaticPolicy` does)."""
    from policies import POLICIES

    policy_config = config.policy.policy_config()
    check = getattr(POLICIES.get(config.policy.name), "check_pretrained", None)
    if check is None or getattr(policy_config, "model_path", None) is None:
        return
    if config.policy.allow_partial_load and hasattr(policy_config, "allow_partial_load"):
        policy_config.allow_partial_load = True  # as the embodied workflow builds it
    try:
        check(policy_config)
    except (OSError, ValueError) as error:
        raise PreflightError(_with_field_hint(str(error), "policy.config.allow_pickle"),
                             field="policy.config.model_path") from None


def _with_field_hint(message: str, pickle_field: str) -> str:
    """``message`` with the loaders' generic ``allow_pickle`` advice naming the template field."""
    return message.replace("set allow_pickle: true", f"set {pickle_field}: true")
