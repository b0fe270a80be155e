"""The procedural arithmetic dataset: distinct problems, disjoint splits, verl-format rows."""

from __future__ import annotations

import pytest

from vla_rl.data.arithmetic import DATA_SOURCE, write_arithmetic_dataset
from vla_rl.data.prompt_dataset import PromptFile
from vla_rl.rewards.verifiers import verify
from vla_rl_core.arithmetic import LEVELS, Level, sample_problems


def test_problems_are_distinct_reproducible_and_cover_the_levels():
    problems = sample_problems(400, seed=3)
    assert len(set(problems)) == 400
    assert problems == sample_problems(400, seed=3)
    assert {p.level for p in problems} == {level.name for level in LEVELS}
    for p in problems:
        assert p.answer == eval(f"{p.a} {p.op} {p.b}") and p.answer >= 0


def test_solution_is_gsm8k_style_and_verifies():
    (problem,) = sample_problems(1, seed=0)
    assert problem.solution.endswith(f"\n#### {problem.answer}")
    assert verify(DATA_SOURCE, problem.solution, str(problem.answer)).correct


def test_a_small_level_is_exhausted_then_others_fill_in():
    tiny = Level("tiny", "+", (0, 1), (0, 1), weight=100.0)
    problems = sample_problems(10, seed=0, levels=(tiny, LEVELS[2]))
    assert sum(p.level == "tiny" for p in problems) == tiny.pool_size() == 4
    with pytest.raises(ValueError, match="only 4"):
        sample_problems(5, seed=0, levels=(tiny,))


def test_subtraction_pool_size_counts_non_negative_answers():
    level = Level("sub", "-", (2, 3), (0, 9), weight=1.0)
    assert level.pool_size() == 3 + 4  # a=2: b in 0..2; a=3: b in 0..3
    assert len(set(sample_problems(7, seed=0, levels=(level,)))) == 7


@pytest.mark.parametrize("file_format", ["parquet", "jsonl"])
def test_written_splits_are_disjoint_verl_rows(tmp_path, file_format):
    paths = write_arithmetic_dataset(
        tmp_path, num_train=300, num_test=50, seed=1, row_group_size=64, file_format=file_format
    )
    train = PromptFile(paths["train"]).read_shard(0, 1, ["extra_info.answer", "extra_info.level"])
    test = PromptFile(paths["test"]).read_shard(0, 1, ["extra_info.answer"])
    assert (len(train), len(test)) == (300, 50)
    assert not {r.prompt[0]["content"] for r in train} & {r.prompt[0]["content"] for r in test}
    row = train[0]
    assert row.data_source == DATA_SOURCE and row.prompt[0]["role"] == "user"
    assert row.extra["extra_info.answer"].endswith(f"#### {row.ground_truth}")
    if file_format == "parquet":
        assert PromptFile(paths["train"])._parquet.num_row_groups == 5  # ceil(300 / 64)


def test_no_held_out_question_is_a_training_question_at_the_templates_sizes(tmp_path):
    """14 + 7 is a problem of add_small and of add_2x1digit: the training draw excluded the
    held-out problems, not their questions, and 37 of llm_grpo's 256 held-out questions (8000 / 256,
    seed 0) were training questions too."""
    paths = write_arithmetic_dataset(tmp_path, num_train=8000, num_test=256, seed=0, row_group_size=1024)
    questions = {split: {r.prompt[0]["content"] for r in PromptFile(paths[split]).read_shard(0, 1)}
                 for split in ("train", "test")}
    assert not questions["train"] & questions["test"]
    assert 250 <= len(questions["test"]) <= 256  # the same question at two levels within a split is one


def test_by_default_each_split_can_be_read_by_8_workers(tmp_path):
    """llm.md's call with the default 256 held-out problems wrote them in one row group of 256,
    which the pre-flight of 2 workers refuses (a worker reads whole row groups)."""
    paths = write_arithmetic_dataset(tmp_path, num_train=4000, num_test=256)
    assert PromptFile(paths["test"])._parquet.num_row_groups == 8  # 32 rows each
    assert PromptFile(paths["train"])._parquet.num_row_groups == 16  # 256 rows each, at most
    # a split whose size 8 does not divide: 20 rows were 7 groups of 3 (and 2); a split of fewer
    # than 8 rows has a row group per row
    small = write_arithmetic_dataset(tmp_path / "small", num_train=100, num_test=20)
    assert PromptFile(small["test"])._parquet.num_row_groups == 10  # 2 rows each
    assert PromptFile(small["train"])._parquet.num_row_groups == 9  # 12 rows each, 4 in the last
    tiny = write_arithmetic_dataset(tmp_path / "tiny", num_train=30, num_test=5)
    assert PromptFile(tiny["test"])._parquet.num_row_groups == 5


def test_config_selects_levels_of_the_generated_splits(tmp_path):
    from pydantic import ValidationError

    from vla_rl.config import RunConfig
    from vla_rl.workflows.text_assets import ensure_text_assets

    with pytest.raises(ValidationError, match="add_small"):  # the error lists the known level names
        RunConfig.model_validate({"run": {"workflow": "text"}, "text": {"arithmetic_levels": ["add_3digit"]}})
    for level in LEVELS:  # every level is selectable by name, with at most the rows it holds
        RunConfig.model_validate({"run": {"workflow": "text"}, "text": {
            "arithmetic_levels": [level.name], "num_generated_train": 100, "num_generated_test": 20}})
        with pytest.raises(ValidationError, match=f"hold {level.pool_size()}; ask for fewer rows"):
            RunConfig.model_validate({"run": {"workflow": "text"}, "text": {
                "arithmetic_levels": [level.name], "num_generated_test": 20,
                "num_generated_train": level.pool_size() - 19}})
    config = RunConfig.model_validate({"run": {"workflow": "text"}, "text": {
        "model_path": str(tmp_path), "arithmetic_levels": ["add_small", "sub_2digit"],
        "num_generated_train": 100, "num_generated_test": 20}})
    assets = ensure_text_assets(config, tmp_path)
    for path, rows in ((assets.train_file, 100), (assets.test_file, 20)):
        read = PromptFile(path).read_shard(0, 1, extra_columns=["extra_info.level"])
        assert len(read) == rows
        assert {row.extra["extra_info.level"] for row in read} == {"add_small", "sub_2digit"}


def test_the_held_out_split_is_drawn_with_the_next_seed_and_rows_are_numbered_from_0(tmp_path):
    paths = write_arithmetic_dataset(tmp_path, num_train=20, num_test=10, seed=3, file_format="jsonl")
    test = PromptFile(paths["test"]).read_shard(0, 1, ["extra_info.index", "extra_info.split"])
    assert [row.prompt[0]["content"] for row in test] == [p.question for p in sample_problems(10, seed=4)]
    assert [row.extra["extra_info.index"] for row in test] == list(range(10))
    assert {row.extra["extra_info.split"] for row in test} == {"test"}


def test_an_unknown_file_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="file_format must be 'parquet' or 'jsonl', got 'csv'"):
        write_arithmetic_dataset(tmp_path, num_train=4, num_test=4, file_format="csv")
    assert not list(tmp_path.iterdir())
