"""A procedural arithmetic task in the verl/siiRL prompt format, with GSM8K-style answers.

Each problem is one operation on small integers, asked as a one-turn chat (``"What is 23 + 45?"``)
and answered in the GSM8K style: a worked line, then the final answer after ``####``::

    23 + 45 = 68
    #### 68

Problems come in levels of increasing difficulty (small sums up to two-digit differences), so
that a tiny model warm-started by supervised fine-tuning solves the easy ones and leaves the rest
for RL. Train and held-out splits never share a question (whatever its level).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vla_rl.data.prompt_dataset import write_prompt_file
from vla_rl_core.arithmetic import LEVELS, ArithmeticProblem, Level, sample_problems

#: ``data_source`` of every row (selects the GSM8K-style verifier in :mod:`vla_rl.rewards`).
DATA_SOURCE = "vla_rl/arithmetic"

#: Without a ``row_group_size``: the workers each split can be read by, and the largest row group.
SHARDS_BY_DEFAULT, MAX_ROW_GROUP_SIZE = 8, 256


def problem_row(problem: ArithmeticProblem, split: str, index: int) -> dict[str, Any]:
    """The verl/siiRL row of one problem.

    Returns:
        ``{"prompt": [{"role": "user", "content": question}], "data_source", "ability",
        "reward_model": {"style": "rule", "ground_truth": answer}, "extra_info": {"split",
        "index", "level", "question", "answer": solution}}``; ``extra_info.answer`` is the
        supervised fine-tuning target.
    """
    return {
        "prompt": [{"role": "user", "content": problem.question}],
        "data_source": DATA_SOURCE,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer)},
        "extra_info": {
            "split": split,
            "index": index,
            "level": problem.level,
            "question": problem.question,
            "answer": problem.solution,
        },
    }


def write_arithmetic_dataset(
    out_dir: str | Path,
    num_train: int,
    num_test: int,
    seed: int = 0,
    row_group_size: int | None = None,
    levels: Sequence[Level] = LEVELS,
    file_format: str = "parquet",
) -> dict[str, Path]:
    """Write ``train`` and ``test`` files of problems drawn apart (no question is in both, at any level).

    Args:
        out_dir: directory of the files (created if missing).
        num_train, num_test: rows of each split.
        seed: seed of the training draw (the held-out split uses ``seed + 1``).
        row_group_size: rows per parquet row group (the unit a worker reads; a split needs at
            least one per worker that reads it). None: ``rows // 8`` (at least 1), at most 256, per
            split, so that up to 8 workers read each (a split of fewer rows: a group per row; 256
            rows in one group failed the pre-flight of 2 workers reading the default 256 held-out
            problems, and ``ceil(rows / 8)`` made 7 groups of 20 rows).
        levels: difficulty levels.
        file_format: ``"parquet"`` or ``"jsonl"``.

    Returns:
        ``{"train": path, "test": path}``.

    Raises:
        ValueError: too many problems for the levels, or an unknown ``file_format``.
    """
    if file_format not in ("parquet", "jsonl"):
        raise ValueError(f"file_format must be 'parquet' or 'jsonl', got {file_format!r}")
    # The held-out split is drawn first so that it keeps its share of every level even when the
    # training split exhausts the small ones.
    test = sample_problems(num_test, seed + 1, levels)
    # every level's copy of a held-out question: the same question drawn at another level (14 + 7
    # in add_small and add_2x1digit) put 37 of the 256 held-out questions in llm_grpo's training split
    held_out = {ArithmeticProblem(p.a, p.op, p.b, level.name) for p in test for level in levels
                if level.holds(p.a, p.op, p.b)}
    train = sample_problems(num_train, seed, levels, exclude=held_out)
    out_dir = Path(out_dir)
    paths = {}
    for split, problems in (("train", train), ("test", test)):
        rows = [problem_row(problem, split, i) for i, problem in enumerate(problems)]
        size = row_group_size or max(1, min(MAX_ROW_GROUP_SIZE, len(rows) // SHARDS_BY_DEFAULT))
        paths[split] = write_prompt_file(rows, out_dir / f"{split}.{file_format}", row_group_size=size)
    return paths
