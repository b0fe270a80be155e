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
