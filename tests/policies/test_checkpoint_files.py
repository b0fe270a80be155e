"""policies/checkpoint_files.py: the staged (atomic) model-directory writes every policy's
save_pretrained uses."""

from __future__ import annotations

import pytest

from policies.checkpoint_files import staged_directory


def test_a_staged_directory_appears_whole_and_only_on_success(tmp_path):
    out = tmp_path / "model"
    with staged_directory(out) as staging:
        (staging / "config.json").write_text("{}")
        assert not out.exists()  # nothing visible under the final name while it is written
    assert (out / "config.json").read_text() == "{}"
    assert [p.name for p in tmp_path.iterdir()] == ["model"]  # the staging directory was renamed

    failed = tmp_path / "failed"
    with pytest.raises(RuntimeError, match="disk full"), staged_directory(failed) as staging:
        (staging / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no partial directory left behind


def test_an_existing_directory_is_refused_and_left_alone(tmp_path):
    out = tmp_path / "model"
    out.mkdir()
    (out / "weights").write_text("old")
    with pytest.raises(FileExistsError, match="model exists; write to a new directory"), staged_directory(out):
        pass
    assert (out / "weights").read_text() == "old"
