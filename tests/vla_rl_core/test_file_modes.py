"""vla_rl_core/file_modes.py, and the writers that use it: checkpoints, exports and Hugging Face
directories are readable as the umask allows, not by their writer alone (safetensors 0.8 creates
its files 0600)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from vla_rl_core.file_modes import apply_default_modes, default_mode, umask, uncreatable, write_text_atomically


@contextlib.contextmanager
def process_umask(mask: int) -> Iterator[None]:
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def modes(root: Path) -> dict[str, int]:
    """Permission bits of ``root``'s files and directories, by relative path (symlinks left out)."""
    return {str(path.relative_to(root)): mode(path) for path in sorted(root.rglob("*")) if not path.is_symlink()}


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o077, 0o002])
def test_the_umask_is_read_without_changing_it(mask):
    with process_umask(mask):
        assert umask() == mask
        assert umask() == mask  # reading it left it as it was
        assert default_mode(False) == 0o666 & ~mask
        assert default_mode(True) == 0o777 & ~mask


@pytest.mark.parametrize(("mask", "file_mode", "directory_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_a_tree_gets_the_modes_of_open_and_mkdir(tmp_path, mask, file_mode, directory_mode):
    root = tmp_path / "checkpoint"
    (root / "actor_sharded").mkdir(parents=True)
    for file in (root / "model.safetensors", root / "actor_sharded" / "__0_0.distcp", root / "config.json"):
        file.write_bytes(b"x")
    os.chmod(root / "model.safetensors", 0o600)  # as safetensors writes it
    os.chmod(root / "actor_sharded" / "__0_0.distcp", 0o666)
    os.chmod(root / "actor_sharded", 0o700)  # as tempfile.mkdtemp creates one
    os.chmod(root, 0o700)
    (root / "latest_link").symlink_to(tmp_path / "elsewhere")  # dangling: never followed
    with process_umask(mask):
        apply_default_modes(root)
    assert mode(root) == directory_mode
    assert modes(root) == {"actor_sharded": directory_mode, "actor_sharded/__0_0.distcp": file_mode,
                           "config.json": file_mode, "model.safetensors": file_mode}


def test_one_file_and_a_missing_path(tmp_path):
    file = tmp_path / "model.safetensors"
    file.write_bytes(b"x")
    os.chmod(file, 0o600)
    with process_umask(0o022):
        apply_default_modes(file)
    assert mode(file) == 0o644
    assert mode(tmp_path) != 0o644  # the file's directory is not touched
    with pytest.raises(FileNotFoundError):
        apply_default_modes(tmp_path / "missing")


def test_a_published_checkpoint_is_readable_as_the_umask_allows(tmp_path):
    from vla_rl.checkpoints import files as ckpt

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    with process_umask(0o022):
        ckpt.save_checkpoint(tmp_path, 1, rank=1, generator=torch.Generator().manual_seed(0))
        ckpt.save_checkpoint(tmp_path, 1, rank=0, model=model, optimizer=optimizer,
                             generator=torch.Generator().manual_seed(1))
        final = ckpt.finalize_checkpoint(tmp_path, 1)
    found = modes(final)
    assert "model.safetensors" in found and "optimizer.safetensors" in found and "rng_rank1.safetensors" in found
    assert set(found.values()) == {0o644}, found  # safetensors alone gives its three kinds 0600
    assert mode(final) == 0o755
    from vla_rl.checkpoints.integrity import verify_checkpoint

    verify_checkpoint(final)  # the manifest was written after the modes changed: nothing it hashes changed


def test_a_policy_export_is_readable_as_the_umask_allows(tmp_path):
    from policies.mlp.configuration_mlp import MLPPolicyConfig
    from policies.mlp.modeling_mlp import MLPPolicy

    policy = MLPPolicy(MLPPolicyConfig(obs_dim=4, action_dim=2, hidden_sizes=[8]))
    with process_umask(0o022):
        out = policy.save_pretrained(tmp_path / "export")
    assert mode(out) == 0o755  # not the staging directory's 0700
    assert set(modes(out).values()) == {0o644}, modes(out)
    loaded = MLPPolicy.from_pretrained(out)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), policy.state_dict().values()))


def test_a_hugging_face_directory_is_readable_as_the_umask_allows(tmp_path):
    from policies.causal_lm.loading import load_pretrained, save_pretrained
    from policies.causal_lm.tiny import TinyQwen2Spec, build_tiny_qwen2, train_tokenizer

    spec = TinyQwen2Spec()
    tokenizer = train_tokenizer(["1 + 2 = 3", "4 + 5 = 9"], spec.vocab_size)
    out = tmp_path / "lm"
    with process_umask(0o027):
        save_pretrained(build_tiny_qwen2(tokenizer, spec, seed=0), tokenizer, out)
    weights = sorted(out.glob("*.safetensors"))
    assert weights, sorted(path.name for path in out.iterdir())
    assert {mode(path) for path in weights} == {mode(out / "config.json")} == {0o640}
    load_pretrained(str(out))


def test_what_is_in_the_way_of_a_new_path_is_named_without_writing(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    before = sorted(tmp_path.rglob("*"))
    assert uncreatable(tmp_path / "new") is None
    assert uncreatable(tmp_path / "a" / "b" / "c") is None  # missing parents are made
    assert uncreatable(tmp_path / "file" / "out") == f"{tmp_path / 'file'} is not a directory"
    assert uncreatable(tmp_path / "file" / "a" / "out") == f"{tmp_path / 'file'} is not a directory"
    assert uncreatable(tmp_path / "dangling" / "out") == f"{tmp_path / 'dangling'} is a broken symbolic link"
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write in any directory")
def test_a_directory_without_write_permission_is_named(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        assert uncreatable(locked / "a" / "out") == f"no permission to create entries in {locked}"
    finally:
        locked.chmod(0o755)


def test_an_atomic_write_replaces_the_file_whole_and_a_failed_one_leaves_the_old(tmp_path, monkeypatch):
    path = tmp_path / "report.json"
    write_text_atomically(path, "old")
    write_text_atomically(path, "new")
    assert path.read_text() == "new" and [p.name for p in tmp_path.iterdir()] == ["report.json"]

    def full_disk(self, text):
        Path.write_bytes(self, text.encode()[:1])  # a partial write, then the error
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text_atomically(path, "newer")
    assert path.read_bytes() == b"new"  # what readers see: the last whole file
