"""Pre-flight checks of a text run's inputs: its prompt files (or the arithmetic splits it
generates), the rows it reads, and its model directory (:mod:`vla_rl.preflight`)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_rl.dag.planner import Plan, RunNode
from vla_rl.preflight.errors import PreflightError, with_field_hint

#: The worker resource through which nodes read the training prompts, sharded at their DP size.
PROMPT_LOADERS = "prompt_loaders"
#: Prompt rows rendered and tokenised at a time by the length check.
PROMPT_BATCH_ROWS = 1024


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
            need = ("each shard reads a row group of its own" if field == "text.test_file"  # not a step's share
                    else f"each shard takes {prompts_per_step // dp_size} a step")
            raise PreflightError(f"{name} has {file.num_rows} rows, {dealt}, and {need}: raise {rows} to {least} or "
                                 "more", node=node, field=rows) from None
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
        raise PreflightError(with_field_hint(str(error), "text.allow_pickle"), field=field) from None


def check_text_inputs(config, the_plan: Plan) -> None:
    """The prompt files (generated into a temporary directory where the config leaves them null,
    deleted on return), the model directory and the rows the run reads.

    Raises:
        PreflightError: the first problem found.
    """
    with tempfile.TemporaryDirectory(prefix="vla_rl_preflight_") as scratch:
        read = _check_prompt_files(config, the_plan, _generated_prompts(config, Path(scratch)))
        tokenizer = _check_text_model(config) if config.text.model_path is not None else None
        if read:
            _check_prompt_rows(config, read, tokenizer)
    _check_held_out_prompts(config, the_plan)
