"""Prompt files in the verl/siiRL format: validation, per-shard reads, step batches."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vla_rl.data.prompt_dataset import (
    PromptFile,
    ShardedPromptLoader,
    write_prompt_file,
)


def make_rows(n: int) -> list[dict]:
    return [
        {
            "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"q{i}"}],
            "data_source": "openai/gsm8k",
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i, "answer": f"#### {i}"},
        }
        for i in range(n)
    ]


@pytest.fixture(params=["parquet", "jsonl"])
def prompt_file(request, tmp_path):
    return write_prompt_file(make_rows(40), tmp_path / f"prompts.{request.param}", row_group_size=4)


def test_shards_are_disjoint_and_cover_the_file(prompt_file):
    file = PromptFile(prompt_file)
    shards = [file.read_shard(k, 3, extra_columns=["extra_info.answer"]) for k in range(3)]
    indices = [row.index for shard in shards for row in shard]
    assert sorted(indices) == list(range(40))
    assert [len(s) for s in shards] == file.shard_num_rows(3)
    row = next(r for s in shards for r in s if r.index == 7)
    assert row.prompt == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q7"}]
    assert (row.data_source, row.ground_truth, row.extra) == ("openai/gsm8k", "7", {"extra_info.answer": "#### 7"})


def test_parquet_shard_reads_only_its_row_groups(tmp_path, monkeypatch):
    path = write_prompt_file(make_rows(40), tmp_path / "p.parquet", row_group_size=4)  # 10 row groups
    read_groups = []
    original = pq.ParquetFile.read_row_group

    def spy(self, i, *args, **kwargs):
        read_groups.append(i)
        return original(self, i, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("a shard must not read the whole file")

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    monkeypatch.setattr(pq.ParquetFile, "read", forbidden)
    monkeypatch.setattr(pq, "read_table", forbidden)
    rows = PromptFile(path).read_shard(1, 3)
    assert read_groups == [1, 4, 7]
    assert [r.index for r in rows] == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29, 30, 31]


def test_missing_column_error_names_file_and_column(tmp_path):
    rows = make_rows(4)
    for row in rows:
        del row["reward_model"]["ground_truth"]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match=r"bad\.parquet: missing column 'reward_model\.ground_truth'"):
        PromptFile(path)
    jsonl = tmp_path / "bad.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"bad\.jsonl: row 0 has no column 'reward_model\.ground_truth'"):
        PromptFile(jsonl).read_shard(0, 1)
    with pytest.raises(ValueError, match="missing column 'extra_info.nope'"):
        PromptFile(write_prompt_file(make_rows(4), tmp_path / "ok.parquet")).read_shard(0, 1, ["extra_info.nope"])


def test_invalid_prompt_and_files_are_rejected(tmp_path):
    rows = make_rows(2)
    rows[1]["prompt"] = "a bare string"
    with pytest.raises(ValueError, match=r"row 1: 'prompt' must be a non-empty list"):
        write_prompt_file(rows, tmp_path / "p.parquet")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        PromptFile(tmp_path / "missing.parquet")
    (tmp_path / "p.csv").write_text("x")
    with pytest.raises(ValueError, match="unknown prompt file type"):
        PromptFile(tmp_path / "p.csv")


def test_too_few_row_groups_for_the_shards(tmp_path):
    path = write_prompt_file(make_rows(8), tmp_path / "p.parquet", row_group_size=8)
    with pytest.raises(ValueError, match="has 1 row groups, fewer than the 2 shards"):
        PromptFile(path).read_shard(0, 2)


def test_loader_steps_are_disjoint_across_ranks_and_reproducible(prompt_file):
    loaders = [ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=k, dp_size=2, seed=0) for k in range(2)]
    assert loaders[0].steps_per_epoch == 20 // 3
    seen = []
    for step in range(loaders[0].steps_per_epoch):
        batches = [loader.rows_for_step(step) for loader in loaders]
        assert [len(b) for b in batches] == [3, 3]
        seen += [row.index for batch in batches for row in batch]
    assert len(seen) == len(set(seen))  # no row twice in an epoch
    again = ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=1, dp_size=2, seed=0)
    assert [r.index for r in again.rows_for_step(2)] == [r.index for r in loaders[1].rows_for_step(2)]
    next_epoch = [r.index for r in loaders[1].rows_for_step(loaders[1].steps_per_epoch)]
    assert set(next_epoch) <= {r.index for r in loaders[1].rows}


def test_loader_rejects_bad_step_sizes(prompt_file):
    with pytest.raises(ValueError, match="multiple of the DP size 4"):
        ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=0, dp_size=4, seed=0)
    with pytest.raises(ValueError, match="fewer than the 30 prompts"):
        ShardedPromptLoader(prompt_file, prompts_per_step=60, dp_rank=0, dp_size=2, seed=0)


@pytest.mark.parametrize("row_group_size", [1, 3, 16])
@pytest.mark.parametrize("num_shards", [1, 2, 3])
@pytest.mark.parametrize("per_shard", [1, 5, 8, 16, 17])
def test_least_rows_is_the_fewest_rows_every_shard_has_enough_of(row_group_size, num_shards, per_shard, tmp_path):
    """Against files written and dealt as the workers read them, one row fewer and the least."""
    from vla_rl.data.prompt_dataset import least_rows

    least = least_rows(row_group_size, num_shards, per_shard)

    def smallest_shard(num_rows: int) -> int:
        if num_rows == 0:
            return 0
        path = write_prompt_file(make_rows(num_rows), tmp_path / f"{num_rows}.parquet", row_group_size=row_group_size)
        try:
            return min(PromptFile(path).shard_num_rows(num_shards))
        except ValueError:  # fewer row groups than shards
            return 0

    assert smallest_shard(least) >= per_shard > smallest_shard(least - 1)


def _parquet(tmp_path, num_rows: int, row_group_size: int, name: str = "p.parquet"):
    return write_prompt_file(make_rows(num_rows), tmp_path / name, row_group_size=row_group_size)


@pytest.mark.parametrize("bad, message", [
    ({"reward_model": {"style": "rule", "ground_truth": None}}, r"row 1 has a null 'reward_model\.ground_truth'"),
    ({"prompt": []}, r"row 1: 'prompt' must be a non-empty list"),
    ({"prompt": [{"role": "user", "content": 3}]}, r"row 1: 'prompt' must be a non-empty list"),
])
def test_a_null_answer_an_empty_prompt_or_a_message_without_text_is_refused(tmp_path, bad, message):
    rows = make_rows(2)
    rows[1].update(bad)
    with pytest.raises(ValueError, match=message):
        write_prompt_file(rows, tmp_path / "p.jsonl")
    with pytest.raises(ValueError, match="no rows to write"):
        write_prompt_file([], tmp_path / "empty.jsonl")
    assert not (tmp_path / "p.jsonl").exists() and not (tmp_path / "empty.jsonl").exists()


def test_a_null_extra_column_is_refused_when_read(tmp_path):
    """A null SFT target was trained as the text "None"."""
    rows = make_rows(2)
    rows[1]["extra_info"]["answer"] = None
    path = write_prompt_file(rows, tmp_path / "p.jsonl")
    with pytest.raises(ValueError, match=r"row 1 has a null 'extra_info\.answer'"):
        PromptFile(path).read_shard(0, 1, ["extra_info.answer"])


def test_blank_lines_of_a_jsonl_file_are_no_rows(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in make_rows(3)).replace("\n", "\n\n  \n") + "\n\n")
    file = PromptFile(path)
    assert file.num_rows == 3 and file.shard_num_rows(3) == [1, 1, 1]
    assert [row.ground_truth for row in file.read_shard(0, 1)] == ["0", "1", "2"]


def test_a_shard_outside_the_shard_count_is_refused(prompt_file):
    file = PromptFile(prompt_file)
    for shard in (-1, 3):
        with pytest.raises(ValueError, match=rf"shard {shard} outside \[0, 3\)"):
            file.read_shard(shard, 3)
        with pytest.raises(ValueError, match=rf"shard {shard} outside \[0, 3\)"):
            file.shard_row_indices(shard, 3)
    with pytest.raises(ValueError, match=r"dp_rank 2 outside \[0, 2\)"):
        ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=2, dp_size=2, seed=0)


def test_shard_row_indices_are_the_rows_read_shard_returns(tmp_path):
    file = PromptFile(_parquet(tmp_path, 40, 4))  # 10 row groups dealt round-robin over 3 shards
    assert file.shard_row_indices(1, 3) == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29, 30, 31]
    for shard in range(3):
        assert file.shard_row_indices(shard, 3) == [row.index for row in file.read_shard(shard, 3)]


def test_steps_per_epoch_are_set_by_the_smallest_shard(tmp_path):
    path = _parquet(tmp_path, 40, 4)  # shards of 4, 3 and 3 row groups: 16, 12 and 12 rows
    assert ShardedPromptLoader(path, prompts_per_step=12, dp_rank=0, dp_size=3, seed=0).steps_per_epoch == 12 // 4
    assert ShardedPromptLoader(path, prompts_per_step=36, dp_rank=0, dp_size=3, seed=0).steps_per_epoch == 1


def test_too_small_a_shard_gets_the_row_group_size_that_would_deal_it_enough(tmp_path):
    """11 rows in groups of 8 and 3 give 2 shards 8 and 3 rows, fewer than 5 each: groups of 6
    (6 and 5 rows), the largest that does, give both enough (the hint searched from 11 // 2 = 5 and
    missed it); 12 prompts a step need more rows than the file has."""
    path = _parquet(tmp_path, 11, 8)
    with pytest.raises(ValueError, match=r"shards of 8, 3 rows\); row groups are dealt to the shards whole: rewrite "
                                         r"it with smaller row groups \(pyarrow\.parquet\.write_table\(table, path, "
                                         r"row_group_size=6\)\)"):
        ShardedPromptLoader(path, prompts_per_step=10, dp_rank=0, dp_size=2, seed=0)
    assert PromptFile(_parquet(tmp_path, 11, 6, "rewritten.parquet")).shard_num_rows(2) == [6, 5]
    assert PromptFile(_parquet(tmp_path, 11, 7, "too_large.parquet")).shard_num_rows(2) == [7, 4]
    with pytest.raises(ValueError) as info:
        ShardedPromptLoader(path, prompts_per_step=12, dp_rank=0, dp_size=2, seed=0)
    assert str(info.value).endswith("(shards of 8, 3 rows); lower prompts_per_step or add rows")


def test_each_epoch_is_shuffled_anew(prompt_file):
    loader = ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=0, dp_size=2, seed=0)
    epochs = [[row.index for step in range(e * loader.steps_per_epoch, (e + 1) * loader.steps_per_epoch)
               for row in loader.rows_for_step(step)] for e in range(2)]
    assert epochs[0] != epochs[1] and len(set(epochs[0])) == len(epochs[0]) == 6 * 3


def test_refill_rounds_take_fresh_rows_until_the_shard_runs_out(prompt_file):
    """A shard of 20 rows, 3 a step: 17 rows besides the step's give 5 refill rounds of 3."""
    loader = ShardedPromptLoader(prompt_file, prompts_per_step=6, dp_rank=1, dp_size=2, seed=0)
    taken = [row.index for row in loader.rows_for_step(4)]
    for refill_round in range(1, 6):
        rows = loader.rows_for_refill(4, refill_round)
        assert len(rows) == 3 and {row.index for row in rows} <= {row.index for row in loader.rows}
        taken += [row.index for row in rows]
    assert len(taken) == len(set(taken)) == 18
    with pytest.raises(ValueError, match="shard 1 has 20 rows, too few for refill round 6 of 3 prompts"):
        loader.rows_for_refill(4, 6)
    with pytest.raises(ValueError, match=r"refill rounds count from 1 \(got 0\)"):
        loader.rows_for_refill(4, 0)
