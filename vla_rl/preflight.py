"""Pre-flight checks of a run's input files, on the driver, before Ray starts and before anything
is written to disk.

Without them every bad file shows up in a worker, tens of seconds into a run, as a remote
traceback beside a half-made run directory, and some never show up at all (a model directory
without its tokenizer files trains on empty prompts; weights whose names do not match the
architecture leave it randomly initialised). :func:`preflight` checks what the template names:

- **prompt files** (``text.train_file``, ``text.test_file``; when one is null, the arithmetic
  splits the run would generate, written to a temporary directory and checked the same way): the
  file exists and is readable (parquet: magic bytes and footer; JSONL: every line UTF-8 JSON), the
  columns the run reads exist (``prompt``, ``data_source``, ``reward_model.ground_truth``, and
  ``text.sft_response_column`` for supervised warm starts), and every DP shard of each node that
  reads the training file holds at least ``text.prompts_per_step // dp_size`` rows (the test file:
  a row group per worker; with dynamic sampling, ``1 + max_refill_rounds`` times as many), from
  the parquet metadata alone;
- **the rows of the prompt files the run reads**, streamed in batches: every row's
  ``data_source`` has a verifier (where the rows are scored: a reward node, the evaluation), and
  every prompt fits ``text.max_prompt_length`` tokens, encoded as the workers encode it (the
  policy's processor renders the chat template, or the raw text, and the model's tokenizer, or the
  generated tiny model's, counts the tokens). A prompt too long is refused, not truncated (TRL
  truncates and logs a count): a truncated prompt loses its start, and the workers would refuse
  it at their first step anyway;
- **model checkpoints** (``text.model_path`` / ``text.gguf_file``; ``policy.config.model_path`` of
  the policies that load one, OpenVLA, OpenVLA-OFT and π0, and π0's ``policy.config.tokenizer_path``):
  no custom code named in the configuration files (``auto_map``: nothing from a model directory
  ever runs), the architecture's file (``config.json``; π0's ``pi0_architecture.json`` or
  ``config.json``), a usable tokenizer (with a chat template for chat prompts), whole safetensors
  headers whose tensor names and shapes match the architecture built on the ``meta`` device, no
  pickle weights unless allowed, and the files beside them that the policy reads (OFT's head
  modules; π0's ``norm_stats.json`` and Flow-Noise head); a GGUF file's header (version, key-value
  metadata, tensor infos whose data lies inside the file) and its tokenizer;
- **the trajectory encoder's model** (V-JEPA 2's ``algorithm.vjepa2.model_dir``: its
  ``config.json``), when the reward embeds episodes with it;
- **a task set's tasks** (``simulator.tasks``) declare the same state and action sizes and horizon;
- **the worker resources the nodes declare** (a plug-in's ``register_node(resources=...)``) and
  those they need are registered.

:func:`check_local_packages` (``vla-rl train`` and ``eval``, not ``plan``) adds the optional
packages a local run's workers import: the simulator's extra (LIBERO) and vLLM.

A problem is a :class:`PreflightError` naming the config field and the file, which the command
line prints as one line (exit status 2). The checks reuse the loaders' own code
(:class:`~vla_rl.data.prompt_dataset.PromptFile`, :func:`policies.causal_lm.loading.check_pretrained`,
the policies' ``check_pretrained``), so what passes here loads in the workers.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import Template
from vla_rl.dag.planner import Plan, RunNode, plan

#: The worker resource through which nodes read the training prompts, sharded at their DP size.
PROMPT_LOADERS = "prompt_loaders"
#: Prompt rows rendered and tokenised at a time by the length check.
PROMPT_BATCH_ROWS = 1024


class PreflightError(TemplateError):
    """An input file of the run that cannot be used. ``field`` is the config field that names it
    (``text.train_file``, ``policy.config.model_path``, ...), ``node`` the node whose layout it
    does not fit (if any); the message starts with the file at fault."""


def preflight(template: Template, world_size: int | None = None) -> None:
    """Check the files the run will read (see the module docstring); writes nothing outside a
    temporary directory (the generated prompts, deleted on return).

    Args:
        template: a loaded (validated) template.
        world_size: the number of DAG workers (default ``workers.num_workers``).

    Raises:
        PreflightError: the first problem found.
        TemplateError: the template does not plan (see :func:`vla_rl.dag.planner.plan`).
    """
    config = template.config
    the_plan = plan(template, world_size)
    _check_node_resources(config, the_plan, template.path)
    if config.run.workflow == "text":
        with tempfile.TemporaryDirectory(prefix="vla_rl_preflight_") as scratch:
            read = _check_prompt_files(config, the_plan, _generated_prompts(config, Path(scratch)))
            tokenizer = _check_text_model(config) if config.text.model_path is not None else None
            if read:
                _check_prompt_rows(config, read, tokenizer)
        _check_held_out_prompts(config, the_plan)
    else:
        _check_task_set(config)
        _check_policy_checkpoint(config)
        _check_trajectory_encoder(config)


TASK_SET_SIZES = ("state_dim", "action_dim", "horizon")
"""What the tasks of a task set must share, as far as their configs declare it (a config may not
know a size before its environment is built: then the pool's ``spec()`` finds a difference)."""


def _check_task_set(config) -> None:
    """The tasks of ``simulator.tasks`` declare the same state size, action size and horizon (robosuite
    Lift's 15 state values and Stack's 20 are not one task set): otherwise every worker stops once
    its simulators have started."""
    simulator = config.simulator
    if not simulator.multi_task:
        return
    from simulators.registry import SIMULATORS
    from vla_rl_core.components import build_config

    config_class = SIMULATORS.get(simulator.name).config_class
    names = simulator.task_names()
    tasks = [build_config(config_class, env, f"simulator.tasks[{i}]") for i, env in enumerate(simulator.task_envs())]
    for size in TASK_SET_SIZES:
        values = [getattr(task, size, None) for task in tasks]
        for name, value in zip(names[1:], values[1:]):
            if None not in (value, values[0]) and value != values[0]:
                raise PreflightError(f"the tasks of a task set must share their observation and action layout and "
                                     f"horizon, but {name!r} differs from {names[0]!r} in {size}: {value} vs "
                                     f"{values[0]}", field="simulator.tasks")


def _check_node_resources(config, the_plan: Plan, file: Path) -> None:
    """Every worker resource a node declares (``register_node(resources=...)``) is registered,
    with the resources it needs, and none needs itself through its ``needs``: otherwise every
    worker would stop at its setup, after Ray and the simulators started, with a traceback that
    names no node."""
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.workers.resources import RESOURCES

    WORKFLOWS.get(config.run.workflow)  # the workflow kits register their resources on import
    for phase in the_plan.phases.values():
        for task in phase.chains[0]:
            if not isinstance(task, RunNode):
                continue
            for name in sorted(task.resources):
                problem = _resource_problem((name,), RESOURCES)
                if problem is not None:
                    raise TemplateError(f"its function ({task.role}/{task.type}, fn: {task.fn}) declares worker "
                                        f"resource {name!r}: {problem}", file=file, node=task.node_id, field="fn")


def _resource_problem(path: tuple[str, ...], resources) -> str | None:
    """Why the last resource of ``path`` (a declared one, then what each needs) cannot be built,
    or None."""
    name = path[-1]
    if name in path[:-1]:
        return f"the resources it needs need each other in a cycle: {' -> '.join(path)}"
    if name not in resources:
        through = "" if len(path) == 1 else f" (needed through {' -> '.join(path)})"
        return (f"{name!r}{through} is not registered; known: {', '.join(map(str, resources.names()))}. Register it "
                "with vla_rl.workers.resources.register_resource in a module of run.imports")
    for need in resources.get(name).needs:
        problem = _resource_problem((*path, need), resources)
        if problem is not None:
            return problem
    return None


def check_local_packages(config) -> None:
    """The optional packages the workers of a local run import, looked for on the driver's Python,
    which those workers share: the simulator's optional extra (its ``unavailable_reason``: LIBERO)
    and vLLM for ``text.rollout_backend: vllm``. A missing one is refused here, before Ray starts,
    rather than by every worker once started (measured on the 2-core machine: LIBERO after 21 s,
    vLLM after 2 min, each as a Ray traceback). Not checked for a run that joins a cluster
    (``workers.ray_address``, ``RAY_ADDRESS``), whose workers import from the cluster's
    environment, nor by ``vla-rl plan``, which may validate a run meant for another machine.

    Raises:
        PreflightError: naming the field that asks for the package (``simulator.name``,
            ``text.rollout_backend``) and how to install it.
    """
    import importlib.util

    from vla_rl.utils.ray_utils import cluster_address

    if cluster_address(config.workers.ray_address) is not None:
        return
    if config.run.workflow == "embodied":
        reason = simulator_unavailable(config.simulator.name)
        if reason is not None:
            raise PreflightError(reason, field="simulator.name")
    elif config.text.rollout_backend == "vllm" and importlib.util.find_spec("vllm") is None:
        from vla_rl.rollout.vllm_backend import vllm_missing_message

        raise PreflightError(vllm_missing_message("No module named 'vllm'"), field="text.rollout_backend")


def simulator_unavailable(name: str) -> str | None:
    """Why simulator ``name`` cannot run on this Python (its optional extra is missing: the
    class's ``unavailable_reason``, LIBERO's), or None."""
    from simulators.registry import SIMULATORS

    unavailable = getattr(SIMULATORS.get(name), "unavailable_reason", None)
    return unavailable() if unavailable is not None else None


def check_simulator(config) -> None:
    """The simulator settings only the simulator library can check (the class's ``check_config``,
    :func:`simulators.registry.check_env`: robosuite's observation keys and cameras), for every
    task of the run, with the camera of its evaluation videos when it records any. Run on the
    driver before Ray starts: a typo found by the workers comes as a Ray traceback once they and
    their simulators have started (measured: 23 s on the 2-core machine for
    ``simulator.env.obs_keys``). Not checked for a run that joins a cluster, whose driver may lack
    the simulator library, nor by ``vla-rl plan``; an unavailable simulator is
    :func:`check_local_packages`' to report.

    Raises:
        PreflightError: naming the field (``simulator.env.obs_keys``, ``simulator.env.cameras``,
            ``eval.video_camera``) and the names the task has.
    """
    from simulators.registry import check_env
    from vla_rl.evaluation.video import renders_videos, video_camera
    from vla_rl.utils.ray_utils import cluster_address
    from vla_rl_core.components import ComponentConfigError

    simulator = config.simulator
    if (config.run.workflow != "embodied" or cluster_address(config.workers.ray_address) is not None
            or simulator_unavailable(simulator.name) is not None):
        return
    camera = video_camera(config, simulator.name)
    videos = config.eval.video_episodes > 0 and config.eval.num_episodes > 0 and renders_videos(simulator.name)
    for env in simulator.task_envs():
        try:  # the run's own settings (its render_camera too: the videos' camera replaces it only there)
            check_env(simulator.name, env)
        except ComponentConfigError as err:
            raise PreflightError(err.message, field=err.field) from None
        _check_encoder_camera(config, env)
        if videos:
            try:
                check_env(simulator.name, {**env, "render_camera": camera})
            except ComponentConfigError as err:
                raise PreflightError(f"the evaluation videos' camera {camera!r}: {err.message}",
                                     field="eval.video_camera") from None


def _check_encoder_camera(config, env) -> None:
    """A trajectory encoder of camera frames (``reads_frames``: ``policy_backbone``, ``vjepa2``)
    reads ``<camera>_image`` observations, which the task's ``simulator.env.cameras`` must render;
    the workers' first reward found it before, after the warm start and a rollout, as a Ray
    traceback. A simulator config without ``cameras`` is not checked.

    Raises:
        PreflightError: naming ``algorithm.<encoder>.camera`` and the cameras the task renders.
    """
    from simulators.registry import build_env_config
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    algorithm = config.algorithm
    name = algorithm.trajectory_encoder
    if not algorithm.embeds_trajectories() or not getattr(TRAJECTORY_ENCODERS.get(name), "reads_frames", False):
        return
    cameras = getattr(build_env_config(config.simulator.name, env), "cameras", None)
    camera = algorithm.options("trajectory_encoder").camera
    if cameras is not None and camera not in cameras:
        rendered = f"renders {', '.join(cameras)}" if cameras else "renders no camera (state observations)"
        raise PreflightError(f"trajectory encoder {name!r} reads the {camera!r} camera's frames, and "
                             f"simulator.env.cameras {rendered}: add it there, or set algorithm.{name}.camera to a "
                             "camera it renders", field=f"algorithm.{name}.camera")


@dataclass(frozen=True)
class _ReadPrompts:
    """A prompt file whose rows the run encodes (``scored``: and scores with the verifiers):
    those of ``rows`` (file positions), or all of them."""

    file: Any  # vla_rl.data.prompt_dataset.PromptFile
    field: str
    scored: bool
    rows: frozenset[int] | None = None
    sft_column: str | None = None  # the column of supervised targets the run trains on, if any
    generated: str | None = None  # the generated split's description (its file is temporary)

    @property
    def name(self) -> str:
        """What messages call the file."""
        return self.generated or str(self.file.path)


def _generated_prompts(config, scratch: Path) -> dict[str, str]:
    """``{"text.train_file": path, ...}``: the arithmetic splits the run generates for the prompt
    files its config leaves null, written under ``scratch`` as the run writes them."""
    from vla_rl.workflows.text_assets import write_generated_prompts

    text = config.text
    if text.train_file is not None and text.test_file is not None:
        return {}
    paths = write_generated_prompts(config, scratch)
    return {field: str(paths[split]) for field, split in (("text.train_file", "train"), ("text.test_file", "test"))
            if getattr(text, field.removeprefix("text.")) is None}


def _generated_name(field: str) -> str:
    split = "train" if field == "text.train_file" else "test"
    return f"the generated arithmetic {split} split ({field} is null)"


def _check_prompt_files(config, the_plan: Plan, generated: dict[str, str]) -> list[_ReadPrompts]:
    """``text.train_file`` in every layout a node reads it with, ``text.test_file`` in the
    evaluation's (one shard per worker); ``generated``: the files of the null ones
    (:func:`_generated_prompts`). Returns the files whose rows the run reads."""
    text = config.text
    tasks = [task for phase in the_plan.phases.values() for task in phase.chains[0] if isinstance(task, RunNode)]
    layouts = {}  # dp_size -> the first node reading the training prompts at that size
    for task in tasks:
        if PROMPT_LOADERS in task.resources:
            layouts.setdefault(task.dp_size, task.node_id)
    sft_targets = text.sft_steps > 0 or any(task.role == "data" and task.fn == "sft" for task in tasks)
    scores_training_rows = any(task.role == "reward" and PROMPT_LOADERS in task.resources for task in tasks)
    read = []
    train_name = _generated_name("text.train_file") if "text.train_file" in generated else None
    file = _check_prompt_file(generated.get("text.train_file", text.train_file), "text.train_file",
                              text.prompts_per_step, layouts,
                              sft_column=text.sft_response_column if sft_targets else None, name=train_name,
                              sft_warm_start=text.sft_steps > 0)
    refills = config.algorithm.filter_groups.max_refill_rounds
    if refills and any(task.fn == "dynamic_sampling" for task in tasks):
        _check_refill_rows(file, text.prompts_per_step, layouts, refills, train_name)
    if layouts or sft_targets:
        read.append(_ReadPrompts(file, "text.train_file", scores_training_rows,
                                 sft_column=text.sft_response_column if sft_targets else None, generated=train_name))
    evaluates = "evaluate" in the_plan.phases and config.eval.num_episodes > 0
    test_name = _generated_name("text.test_file") if "text.test_file" in generated else None
    file = _check_prompt_file(generated.get("text.test_file", text.test_file), "text.test_file",
                              the_plan.world_size, {the_plan.world_size: None} if evaluates else {}, name=test_name)
    if evaluates:
        read.append(_ReadPrompts(file, "text.test_file", True, _evaluated_rows(file, config.eval.num_episodes,
                                                                                the_plan.world_size),
                                 generated=test_name))
    return read


def _check_held_out_prompts(config, the_plan: Plan) -> None:
    """A run that trains on its own prompts (``text.train_file``) and evaluates is refused
    without held-out prompts of them (``text.test_file`` null): it evaluated the generated
    arithmetic split, with no notice."""
    text = config.text
    evaluates = "evaluate" in the_plan.phases and config.eval.num_episodes > 0
    if evaluates and text.train_file is not None and text.test_file is None:
        raise PreflightError(f"null with text.train_file set ({text.train_file}): the evaluation would score the "
                             "generated arithmetic test split, not held-out prompts of the training data; give "
                             "held-out prompts in the same format (verl's data.val_files), or set eval.num_episodes=0 "
                             "to train without evaluating", field="text.test_file")


def _evaluated_rows(file, num_episodes: int, world_size: int) -> frozenset[int]:
    """The rows of the test file that the evaluation reads: each worker's first quota of its
    shard (:class:`~vla_rl.evaluation.text.TextEvaluation`)."""
    from vla_rl.evaluation.text import eval_quotas

    shards = [file.shard_row_indices(rank, world_size) for rank in range(world_size)]
    quotas = eval_quotas(num_episodes, [len(shard) for shard in shards])
    return frozenset(index for shard, quota in zip(shards, quotas) for index in shard[:quota])


def _check_prompt_file(path: str, field: str, prompts_per_step: int, layouts: dict[int, str | None],
                       sft_column: str | None = None, name: str | None = None, sft_warm_start: bool = False):
    """One prompt file: readable, with the columns (and ``sft_column``, the warm start's targets,
    when given), and ``prompts_per_step // dp_size`` rows in every shard of each layout
    (``dp_size -> node``); ``name``: what messages call it instead of its path (a generated
    file). Returns its :class:`~vla_rl.data.prompt_dataset.PromptFile`."""
    from vla_rl.data.prompt_dataset import PromptFile, least_rows, shard_steps_per_epoch
    from vla_rl.workflows.text_assets import GENERATED_ROW_GROUP_SIZE

    def named(error: Exception) -> str:
        return str(error) if name is None else str(error).replace(str(path), name)

    try:
        file = PromptFile(path)
    except (OSError, ValueError) as error:
        raise PreflightError(named(error), field=field) from None
    try:
        file.validate((sft_column,) if sft_column else ())
    except (OSError, ValueError) as error:
        absent = (f"no column {sft_column!r}", f"missing column {sft_column!r}")  # not a row's null target
        if sft_column and any(phrase in str(error) for phrase in absent):
            reader = ("the supervised warm start's targets (text.sft_steps > 0)" if sft_warm_start
                      else "the supervised fine-tuning's targets")
            raise PreflightError(f"{named(error)}: {reader} are read from this column; name the file's column that "
                                 "holds them (dotted for a nested field)"
                                 + (", or set text.sft_steps=0" if sft_warm_start else ""),
                                 field="text.sft_response_column") from None
        raise PreflightError(named(error), field=field) from None
    for dp_size, node in sorted(layouts.items()):
        try:
            shard_steps_per_epoch(file, prompts_per_step, dp_size)
        except ValueError as error:
            if name is None:
                raise PreflightError(named(error), node=node, field=field) from None
            rows = field.replace("text.", "text.num_generated_").removesuffix("_file")  # a generated split's size
            try:
                shards = ", ".join(map(str, file.shard_num_rows(dp_size)))
                dealt = f"dealt in whole row groups to {dp_size} shards of {shards} rows"
            except ValueError:
                dealt = f"in fewer row groups than the {dp_size} shards that read it"
            least = least_rows(GENERATED_ROW_GROUP_SIZE, dp_size, max(prompts_per_step // dp_size, 1))
            raise PreflightError(f"{name} has {file.num_rows} rows, {dealt}, and each shard takes "
                                 f"{prompts_per_step // dp_size} a step: raise {rows} to {least} or more", node=node,
                                 field=rows) from None
    return file


def _check_refill_rows(file, prompts_per_step: int, layouts: dict[int, str | None], refills: int,
                       name: str | None) -> None:
    """Dynamic sampling's refill rounds take fresh rows of the worker's shard, none repeated within
    a step (:meth:`~vla_rl.data.prompt_dataset.ShardedPromptLoader.rows_for_refill`): every
    shard needs ``(1 + refills) * prompts_per_step // dp_size`` rows, or the run stopped in the
    round that ran out, with a traceback.

    Raises:
        PreflightError: ``algorithm.filter_groups.max_refill_rounds``, naming the file, the
            smallest shard and the most rounds its rows allow.
    """
    for dp_size, node in sorted(layouts.items()):
        per_shard = prompts_per_step // dp_size
        smallest = min(file.shard_num_rows(dp_size))
        if smallest < (1 + refills) * per_shard:
            raise PreflightError(
                f"{name or file.path}: its smallest shard ({dp_size} shards) has {smallest} rows; a step with all "
                f"{refills} refill rounds takes {(1 + refills) * per_shard} different ones ({per_shard} a round): "
                f"set at most {smallest // per_shard - 1} rounds, or add rows (or lower text.prompts_per_step)",
                node=node, field="algorithm.filter_groups.max_refill_rounds")


def _check_prompt_rows(config, read: list[_ReadPrompts], tokenizer) -> None:
    """Every row of the files the run reads: a verifier for its ``data_source`` (scored files)
    and a prompt of at most ``text.max_prompt_length`` tokens, rendered and tokenised as the
    workers' :meth:`~policies.causal_lm.processor_causal_lm.CausalLMProcessor.encode_prompts`
    does (``tokenizer``: the model's; ``None``: the generated tiny model's)."""
    from policies.causal_lm.processor_causal_lm import CausalLMProcessor

    if tokenizer is None:
        from policies.causal_lm.tiny import (
            TinyQwen2Spec,
            arithmetic_corpus,
            train_tokenizer,
        )

        tokenizer = train_tokenizer(arithmetic_corpus(), TinyQwen2Spec().vocab_size)  # as the run generates it
    processor = CausalLMProcessor(tokenizer, prompt_format=config.text.prompt_format,
                                  chat_template_kwargs=config.text.chat_template_kwargs)
    for prompts in read:
        try:
            _check_rows_of(prompts, processor, config.text.max_prompt_length)
            if prompts.sft_column is not None:
                _check_sft_targets(prompts, processor, config.text.max_response_length)
        except ValueError as error:
            raise PreflightError(str(error), field=prompts.field) from None


def _check_sft_targets(prompts: _ReadPrompts, processor, max_response_length: int) -> None:
    """Every row's supervised target (``prompts.sft_column``): present, not null (the file's
    reader refuses both) and, with its end-of-turn token, at most ``max_response_length`` tokens
    as :meth:`~policies.causal_lm.processor_causal_lm.CausalLMProcessor.encode_responses` encodes it.

    Raises:
        ValueError: the first missing or null target, or the longest one over the limit, naming
            the file and the row.
    """
    column, path = prompts.sft_column, prompts.name
    too_long, longest, longest_row = 0, 0, None
    for rows in prompts.file.iter_rows(PROMPT_BATCH_ROWS, extra_columns=(column,)):
        texts = [str(row.extra[column]) for row in rows]
        for row, ids in zip(rows, processor.tokenizer(texts, add_special_tokens=False)["input_ids"]):
            if len(ids) + 1 > max_response_length:  # + its end-of-turn token
                too_long += 1
                if len(ids) + 1 > longest:
                    longest, longest_row = len(ids) + 1, row.index
    if too_long:
        raise ValueError(f"{path}: {too_long} supervised targets ({column!r}) are longer than "
                         f"text.max_response_length={max_response_length} tokens with their end-of-turn token; the "
                         f"longest, row {longest_row}, has {longest}: raise text.max_response_length to {longest}"
                         + ("" if prompts.generated else " or filter the long rows out of the file"))


def _check_rows_of(prompts: _ReadPrompts, processor, max_prompt_length: int) -> None:
    """One file's rows (see :func:`_check_prompt_rows`).

    Raises:
        ValueError: the first row whose data source has no verifier or whose prompt does not
            render; else the longest prompt over ``max_prompt_length``; naming the file.
    """
    from vla_rl.rewards.verifiers import known_data_sources, unknown_data_sources

    path = prompts.name
    how = "after the chat template" if processor.prompt_format == "chat" else "as raw text"
    total, too_long, longest, longest_row = 0, 0, 0, None  # longest: tokens of the longest prompt over the limit
    for rows in prompts.file.iter_rows(PROMPT_BATCH_ROWS):
        if prompts.rows is not None:
            rows = [row for row in rows if row.index in prompts.rows]
        if not rows:
            continue
        unknown = unknown_data_sources([row.data_source for row in rows]) if prompts.scored else []
        if unknown:
            row = next(row for row in rows if row.data_source == unknown[0])
            raise ValueError(f"{path}: row {row.index} has data_source {row.data_source!r}, which no verifier "
                             f"serves (known: {', '.join(known_data_sources())}); fix the row, or register a verifier "
                             "for it (vla_rl.rewards.verifiers.register_verifier, in a module of run.imports)")
        texts = []
        for row in rows:
            try:
                texts.append(processor.render_prompt(row.prompt))
            except Exception as error:  # a chat template is user code: jinja raises its own errors
                raise ValueError(f"{path}: row {row.index}: the chat template does not render its prompt "
                                 f"({type(error).__name__}: {error})") from None
        lengths = [len(ids) for ids in processor.prompt_token_ids(texts)]
        total += len(rows)
        for row, length in zip(rows, lengths):
            if length > max_prompt_length:
                too_long += 1
                if length > longest:
                    longest, longest_row = length, row.index
    if too_long:
        raise ValueError(f"{path}: {too_long} of {total} prompts are longer than text.max_prompt_length="
                         f"{max_prompt_length} tokens {how}; the longest, row {longest_row}, has {longest}: raise "
                         f"text.max_prompt_length to {longest}"
                         + ("" if prompts.generated else " or filter the long prompts out of the file"))


def _check_text_model(config):
    """``text.model_path`` (and ``text.gguf_file``) as the text workflow will load it; returns
    its tokenizer."""
    from policies.causal_lm.loading import check_pretrained
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE
    from vla_rl.workflows.text import HF_MODEL_DIR

    text = config.text
    field = "text.gguf_file" if text.gguf_file is not None and Path(text.model_path).is_dir() else "text.model_path"
    checkpoint = Path(text.model_path)
    if (checkpoint / TRAINER_STATE_FILE).is_file():
        has_copy = (checkpoint / HF_MODEL_DIR / "config.json").is_file()
        raise PreflightError(f"{checkpoint} is a training checkpoint ({TRAINER_STATE_FILE}), not a model directory: "
                             + (f"give its model copy, {checkpoint / HF_MODEL_DIR}" if has_copy else
                                f"it holds no {HF_MODEL_DIR}/ copy (FSDP and LoRA runs write none); write one with "
                                f"vla-rl export {checkpoint} OUT and give OUT"), field="text.model_path")
    try:
        return check_pretrained(text.model_path, text.gguf_file, text.prompt_format, allow_pickle=text.allow_pickle,
                                allow_partial_load=config.policy.allow_partial_load)
    except (OSError, ValueError) as error:
        raise PreflightError(_with_field_hint(str(error), "text.allow_pickle"), field=field) from None


def _check_policy_checkpoint(config) -> None:
    """``policy.config.model_path`` of a policy that loads a pretrained checkpoint (its class
    defines ``check_pretrained``, as :class:`~policies.openvla.policy_base.PrismaticPolicy` does)."""
    from policies import POLICIES
    from policies.checkpoint_files import FieldError

    policy_config = config.policy.policy_config()
    check = getattr(POLICIES.get(config.policy.name), "check_pretrained", None)
    if check is None or all(getattr(policy_config, name, None) is None for name in ("model_path", "tokenizer_path")):
        return
    _check_model_directory_kind(config.policy.name, getattr(policy_config, "model_path", None))
    if config.policy.allow_partial_load and hasattr(policy_config, "allow_partial_load"):
        policy_config.allow_partial_load = True  # as the embodied workflow builds it
    try:
        check(policy_config)
    except (OSError, ValueError) as error:
        field = error.field if isinstance(error, FieldError) else "model_path"
        raise PreflightError(_with_field_hint(str(error), "policy.config.allow_pickle"),
                             field=f"policy.config.{field}") from None


def _check_model_directory_kind(policy: str, model_path: str | None) -> None:
    """A ``policy.config.model_path`` that is a training checkpoint (``trainer_state.json``: the
    run's format, not a model directory), or a model directory of another of our policies (its
    ``config.json`` names it, as ``vla-rl export`` of an MLP run writes), is refused naming what it
    is and what to do; the policy's own checks would only name a file it lacks.

    Raises:
        PreflightError: naming ``policy.config.model_path``.
    """
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE

    if model_path is None:
        return
    directory = Path(model_path)
    if (directory / TRAINER_STATE_FILE).is_file():
        raise PreflightError(f"{directory} is a training checkpoint ({TRAINER_STATE_FILE}), not a model directory: "
                             f"evaluate it with vla-rl eval {directory}, or write its model directory with vla-rl "
                             "export", field="policy.config.model_path")
    try:
        saved = json.loads((directory / "config.json").read_text())
    except (OSError, ValueError):
        return  # no readable config.json: the policy's own check says what is wrong
    other = saved.get("policy") if isinstance(saved, dict) else None
    if isinstance(other, str) and other != policy:
        raise PreflightError(f"{directory} holds a {other!r} policy (its config.json), not a {policy!r} one: use a "
                             f"template of the {other} policy", field="policy.config.model_path")


def _check_trajectory_encoder(config) -> None:
    """The run's trajectory encoder, when its reward embeds episodes: its config's ``points``, and
    the files it reads (its class's ``check_config``: V-JEPA 2's ``model_dir``); found by the workers'
    first reward before, after the demonstrations and behaviour cloning (3 min 30 s on the 2-core
    machine), as a Ray traceback."""
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    name = config.algorithm.trajectory_encoder
    if not config.algorithm.embeds_trajectories():
        return
    options = config.algorithm.options("trajectory_encoder")
    if not isinstance(getattr(options, "points", None), int):
        raise PreflightError(f"trajectory encoder {name!r}: its config ({type(options).__name__}) has no integer "
                             "'points' field, the number of states a reward takes from each episode, which every "
                             "encoder's config carries (docs/extending.md)", field="algorithm.trajectory_encoder")
    check = getattr(TRAJECTORY_ENCODERS.get(name), "check_config", None)
    if check is None:
        return
    try:
        check(config.algorithm.options("trajectory_encoder"))
    except (OSError, ValueError) as error:
        raise PreflightError(str(error), field=f"algorithm.{name}") from None


def _with_field_hint(message: str, pickle_field: str) -> str:
    """``message`` with the loaders' generic ``allow_pickle`` advice naming the template field."""
    return message.replace("set allow_pickle: true", f"set {pickle_field}: true")
