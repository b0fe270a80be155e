"""Edges of vla_rl.checkpoints.files, integrity, layout and sharded that the round trips of
test_checkpoints.py do not reach: step names past 8 digits, tied and excluded tensors, pruning
around a resumed step, size-only verification, the layout's readers and the sharded state's refusals."""

from __future__ import annotations

import json
import pickle

import pytest
import torch

from vla_rl.checkpoints import files as ckpt
from vla_rl.checkpoints import integrity, layout, sharded
from vla_rl.checkpoints.layout import CheckpointCorruptError, NonFiniteTensorError


def finalized(root, step, **kwargs):
    ckpt.save_checkpoint(root, step, **kwargs)
    return ckpt.finalize_checkpoint(root, step)


class Tied(torch.nn.Module):
    """An encoder and a decoder sharing one weight (as tied embeddings), and a bias of its own."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.encoder = torch.nn.Linear(3, 3, bias=False)
        self.decoder = torch.nn.Linear(3, 3)
        self.decoder.weight = self.encoder.weight


# ---- files ------------------------------------------------------------------------------------


@pytest.mark.parametrize("step", [True, -1, 2.0])
def test_a_step_that_is_not_a_non_negative_int_is_refused(tmp_path, step):
    with pytest.raises(ValueError, match="checkpoint step must be a non-negative int"):
        ckpt.save_checkpoint(tmp_path, step)
    assert list(tmp_path.iterdir()) == []


def test_the_newest_checkpoint_is_the_highest_step_also_past_eight_digits(tmp_path):
    finalized(tmp_path, 99_999_999)
    finalized(tmp_path, 100_000_000)  # step_100000000 sorts before step_99999999 by name
    (tmp_path / "latest").unlink()
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_100000000"
    assert [ckpt.checkpoint_step(p) for p in ckpt.complete_checkpoints(tmp_path)] == [99_999_999, 100_000_000]


def test_a_step_directory_of_fewer_than_eight_digits_is_not_a_checkpoint(tmp_path):
    finalized(tmp_path, 3)
    (tmp_path / "step_5").mkdir()
    (tmp_path / "step_5" / "trainer_state.json").write_text('{"step": 5, "metadata": {}}')
    assert ckpt.complete_checkpoints(tmp_path) == [tmp_path / "step_00000003"]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step_00000003"
    assert ckpt.checkpoint_step(tmp_path / "step_5") is None


def test_a_prune_keeps_the_step_just_saved_though_a_newer_one_exists(tmp_path):
    """A run resumed from step 5 while step 20 of an earlier attempt exists saves step 10:
    keep_last=1 keeps the newest (20) and never removes the step just saved."""
    finalized(tmp_path, 5)
    finalized(tmp_path, 20)
    ckpt.save_checkpoint(tmp_path, 10)
    ckpt.finalize_checkpoint(tmp_path, 10, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000010", "step_00000020"]


def test_a_prune_removes_checkpoints_left_half_deleted(tmp_path):
    finalized(tmp_path, 1)
    (tmp_path / ".step_00000000.deleting").mkdir()  # a prune killed between its rename and its rmtree
    ckpt.save_checkpoint(tmp_path, 2)
    ckpt.finalize_checkpoint(tmp_path, 2, keep_last=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000001", "step_00000002"]


def test_discarding_one_steps_staging_leaves_the_others(tmp_path):
    for step in (1, 2):
        ckpt.save_checkpoint(tmp_path, step)
    ckpt.discard_staging(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".step_00000001.tmp"]
    ckpt.discard_staging(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_tied_module_part_is_written_once_and_loads_back(tmp_path):
    saved, restored = Tied(0), Tied(1)
    ckpt.save_module_part(tmp_path, saved, exclude=(), name="part")
    header_len = int.from_bytes((tmp_path / "part.safetensors").read_bytes()[:8], "little")
    header = json.loads((tmp_path / "part.safetensors").read_bytes()[8:8 + header_len])
    assert sorted(k for k in header if k != "__metadata__") == ["decoder.bias", "encoder.weight"]  # first name
    ckpt.load_module_part(tmp_path, restored, exclude=(), name="part")
    assert torch.equal(restored.encoder.weight, saved.encoder.weight)
    assert torch.equal(restored.decoder.weight, saved.encoder.weight)
    assert torch.equal(restored.decoder.bias, saved.decoder.bias)


def test_excluded_entries_are_left_as_they_are_also_when_the_file_holds_them(tmp_path):
    saved, restored = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = restored.weight.detach().clone()
    ckpt.save_module_part(tmp_path, saved, exclude=(), name="whole")
    ckpt.load_module_part(tmp_path, restored, exclude={"weight"}, name="whole")
    assert torch.equal(restored.weight, before) and torch.equal(restored.bias, saved.bias)


def test_the_run_state_is_the_metadatas_run_entry_only(tmp_path):
    ckpt.save_trainer_state(tmp_path, 4, {"lr": 0.1, "run": {"env_steps": 96.0}})
    assert ckpt.load_run_state(tmp_path) == {"env_steps": 96.0}
    ckpt.save_trainer_state(tmp_path, 4, {"lr": 0.1})  # written before checkpoints recorded it
    assert ckpt.load_run_state(tmp_path) == {}


def test_the_policy_weights_come_from_model_safetensors_when_it_is_there(tmp_path):
    saved, restored = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    ckpt.save_model(tmp_path, saved)
    (tmp_path / "actor_sharded").mkdir()  # not read: the replicated weights come first
    ckpt.load_policy_weights(tmp_path, restored)
    assert torch.equal(restored.weight, saved.weight)


def test_a_seed_sweeps_directory_is_not_taken_for_a_checkpoint(tmp_path):
    (tmp_path / "sweep.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="is a sweep of seeds"):
        ckpt.run_checkpoint(tmp_path)


def test_state_whose_dict_keys_look_like_markers_round_trips(tmp_path):
    state = {"__tensor__": "0:x", "__tuple__": [1], "plain": (1, 2)}
    tensors: dict = {}
    encoded = json.loads(json.dumps(ckpt._encode(state, tensors, "s", tmp_path / "s.json")))
    assert ckpt._decode(encoded, tensors, tmp_path / "s.json") == state


# ---- integrity ----------------------------------------------------------------------------------


def test_a_size_only_check_sees_a_grown_file_but_not_altered_bytes(tmp_path):
    path = finalized(tmp_path, 1, model=torch.nn.Linear(2, 2))
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(data))  # same size, other bytes
    assert integrity.verify_checkpoint(path, digests=False) is True
    with pytest.raises(CheckpointCorruptError, match="does not match its sha256"):
        integrity.verify_checkpoint(path)
    (path / "model.safetensors").write_bytes(bytes(data) + b"\0")
    with pytest.raises(CheckpointCorruptError, match=r"has \d+ bytes, the manifest says \d+"):
        integrity.verify_checkpoint(path, digests=False)


def test_verification_names_every_damaged_file_in_its_error(tmp_path):
    path = finalized(tmp_path, 1, model=torch.nn.Linear(2, 2))
    (path / "model.safetensors").unlink()
    (path / "rng_rank0.json").write_text("{}")
    with pytest.raises(CheckpointCorruptError) as err:
        integrity.verify_checkpoint(path)
    assert sorted(err.value.files) == [path / "model.safetensors", path / "rng_rank0.json"]


def test_a_checkpoints_identity_does_not_depend_on_the_manifests_order(tmp_path):
    files = {"a.json": {"size": 1, "sha256": "0" * 64}, "b.json": {"size": 2, "sha256": "1" * 64}}
    for name, order in (("one", files), ("two", dict(reversed(files.items())))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text(json.dumps({"format_version": 1, "files": order}))
    assert integrity.checkpoint_identity(tmp_path / "one") == integrity.checkpoint_identity(tmp_path / "two")
    assert integrity.checkpoint_identity(tmp_path / "one") is not None


def test_an_incomplete_sharded_directory_is_no_fsdp_checkpoint(tmp_path):
    (tmp_path / "actor_sharded").mkdir()  # DCP's coordinator never wrote .metadata
    assert integrity.checkpoint_strategy(tmp_path) is None
    (tmp_path / "optimizer.json").write_text("{}")
    assert integrity.checkpoint_strategy(tmp_path) == "ddp"


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # a one-process save, as asked
def test_the_policy_shapes_of_a_sharded_checkpoint_are_its_model_entries_only(tmp_path):
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.zeros(2, 3), "b": torch.zeros(2)},
             "optimizer": {"state": {"w": {"exp_avg": torch.zeros(2, 3)}}}}
    dcp.save(state, checkpoint_id=str(tmp_path / "actor_sharded"), no_dist=True)
    file, shapes = integrity.stored_policy_shapes(tmp_path)
    assert file == tmp_path / "actor_sharded" / ".metadata"
    assert shapes == {"w": (2, 3), "b": (2,)}


# ---- layout -------------------------------------------------------------------------------------


@pytest.mark.parametrize("values", [[-float("inf"), 1.0], [1.0, float("inf")], [0.0, float("nan")]],
                         ids=["-inf", "inf", "nan"])
def test_a_tensor_with_an_infinity_of_either_sign_or_a_nan_is_not_finite(values):
    assert layout.all_finite(torch.tensor(values)) is False
    assert layout.all_finite(torch.tensor([-1e30, 1e30])) is True


def test_a_complex_tensor_holding_an_infinity_is_refused(tmp_path):
    with pytest.raises(NonFiniteTensorError, match=r"tensor 'z' \(2,\) holds 1 non-finite values"):
        layout.check_finite({"z": torch.tensor([1 + 1j, complex(float("inf"), 0)])}, tmp_path / "x.safetensors")


def test_a_corrupt_checkpoint_error_keeps_its_files_through_pickling(tmp_path):
    err = pickle.loads(pickle.dumps(CheckpointCorruptError("bad", [tmp_path / "a", tmp_path / "b"])))
    assert (str(err), err.files) == ("bad", [tmp_path / "a", tmp_path / "b"])


def test_a_json_file_of_bytes_that_are_not_utf8_is_named_corrupt(tmp_path):
    (tmp_path / "trainer_state.json").write_bytes(b'{"step": \xff\xfe}')
    with pytest.raises(CheckpointCorruptError, match="trainer_state.json is not valid JSON"):
        ckpt.load_trainer_state(tmp_path)


def test_fsync_flushes_the_named_file(tmp_path, monkeypatch):
    synced = []
    monkeypatch.setattr(layout.os, "fsync", lambda fd: synced.append(layout.os.fstat(fd).st_ino))
    layout.fsync(tmp_path)
    assert synced == [tmp_path.stat().st_ino]


# ---- sharded ------------------------------------------------------------------------------------


def test_sharded_weights_missing_are_a_file_not_found_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"actor_sharded/\.metadata is missing"):
        sharded.load_sharded_model(tmp_path, torch.nn.Linear(2, 2))


def test_a_sharded_save_of_non_finite_weights_is_refused_naming_the_tensor(tmp_path, process_group):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.bias[1] = float("nan")
    optimizer = torch.optim.Adam(model.parameters())
    with pytest.raises(NonFiniteTensorError, match=r"tensor 'model.bias' of this worker's shard holds non-finite"):
        sharded.save_sharded(tmp_path, model, optimizer)
    assert not (tmp_path / "actor_sharded").exists()
