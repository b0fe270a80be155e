"""Damaged evaluation stores: each kind of damage is found and named (the store, the array, the
chunk), with the command that sets the store aside; the reads of the report and of the workers
say the same instead of a JSON or Blosc traceback; the error crosses Ray (pickled) intact."""

from __future__ import annotations

import pickle
import shutil

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.errors import RunStopped
from vla_rl.evaluation.benchmarks import EvalTask
from vla_rl.evaluation.episode_store import (
    HOSTS_ATTR,
    DamagedStoreError,
    append_episodes,
    check_store,
    check_stores,
    damaged_store,
    open_rank_store,
    stored_keys,
)
from vla_rl.evaluation.protocol import Protocol
from vla_rl.evaluation.report import summarize
from vla_rl.evaluation.targets import EvalInputError
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

SPEC = EnvSpec(obs_dim=3, action_dim=2, horizon=6)


def truncate(path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def empty(path) -> None:
    path.write_bytes(b"")


#: (case, damage, what the message names)
DAMAGES = [
    ("group zarr.json truncated", lambda s: truncate(s / "zarr.json"), "its attributes (zarr.json)"),
    ("group zarr.json empty", lambda s: empty(s / "zarr.json"), "its attributes (zarr.json)"),
    ("array zarr.json truncated", lambda s: truncate(s / "length" / "zarr.json"), "array 'length' (length/zarr.json)"),
    ("scalar chunk truncated", lambda s: truncate(s / "init_state_id" / "c" / "1"),
     "array 'init_state_id', episode 1 (chunk init_state_id/c/1)"),
    ("compressible chunk truncated", lambda s: truncate(s / "obs" / "c" / "0" / "0" / "0"),
     "array 'obs', episode 0 (chunk obs/c/0/0/0)"),
    ("incompressible chunk truncated", lambda s: truncate(s / "actions" / "c" / "2" / "0" / "0" / "0"),
     "array 'actions', episode 2 (chunk actions/c/2/0/0/0)"),  # Blosc alone decodes it into garbage
    ("length chunk missing", lambda s: (s / "length" / "c" / "2").unlink(), "array 'length', episode 2"),
    ("array missing", lambda s: shutil.rmtree(s / "log_probs"), "array 'log_probs'"),
    ("machine not recorded", lambda s: TrajectoryStore.open(s).update_attrs({HOSTS_ATTR: []}),
     "array 'host', episode 0 cannot be read (it names machine 0 of the store's attribute 'hosts', which has 0 "
     "entries)"),
]


@pytest.fixture
def store(tmp_path):
    """A store of 3 episodes (random, incompressible actions; compressible observations)."""
    rank0 = open_rank_store(tmp_path, "Lift", 0, SPEC, 1, {"task": "Lift", "simulator": "s", "env": {}}, True)
    n, horizon = 3, SPEC.horizon
    append_episodes(rank0, TensorDict({
        keys.OBS: torch.arange(n * (horizon + 1) * 3, dtype=torch.float32).reshape(n, horizon + 1, 3),
        keys.ACTIONS: torch.randn(n, horizon, 1, 2), keys.ENV_ACTIONS: torch.randn(n, horizon, 1, 2),
        keys.OLD_LOG_PROBS: torch.randn(n, horizon, 1), keys.FINISH_STEP: torch.tensor([6, 3, 6]),
        keys.SUCCESS: torch.tensor([False, True, False]), keys.TRUNCATED: torch.tensor([True, False, True]),
        keys.INIT_STATE_ID: torch.tensor([10, 11, 12]),
    }, batch_size=[n]), 5, True, 0.0, {"cpu": "test"})
    return rank0.path


def test_an_intact_store_passes(store, tmp_path):
    check_store(store)
    check_stores(tmp_path)


@pytest.mark.parametrize(("case", "damage", "names"), DAMAGES, ids=[d[0] for d in DAMAGES])
def test_each_damage_is_named_with_the_way_out(case, damage, names, store, tmp_path):
    damage(store)
    with pytest.raises(DamagedStoreError) as info:
        check_stores(tmp_path)
    message = str(info.value)
    assert message.startswith(f"evaluation store {store} is damaged: {names}")
    assert message.endswith(f"mv {store} {store}.damaged") and "\n" not in message
    assert isinstance(info.value, EvalInputError) and isinstance(info.value, RunStopped)  # exit 2; a worker's: as is


@pytest.mark.parametrize(("case", "damage", "names"), [d for d in DAMAGES if "scalar" in d[0] or "group" in d[0]],
                         ids=[d[0] for d in DAMAGES if "scalar" in d[0] or "group" in d[0]])
def test_the_reads_of_the_report_and_the_workers_name_the_damage(case, damage, names, store, tmp_path):
    damage(store)
    for read in (lambda: stored_keys(tmp_path, "Lift"),
                 lambda: summarize(tmp_path, [EvalTask("Lift", "s")], [5], [Protocol("greedy", True, 0.0)],
                                   np.array([10, 11, 12]))):
        with pytest.raises(DamagedStoreError, match=f"is damaged: {names.replace('(', '.').replace(')', '.')}"):
            read()


def test_the_report_names_an_episode_whose_machine_the_store_does_not_record(store, tmp_path):
    TrajectoryStore.open(store).update_attrs({HOSTS_ATTR: [{"cpu": "test"}]})  # episodes 0..2 name machine 0
    summarize(tmp_path, [EvalTask("Lift", "s")], [5], [Protocol("greedy", True, 0.0)], np.array([10, 11, 12]))
    TrajectoryStore.open(store).update_attrs({HOSTS_ATTR: ["not a record"]})
    with pytest.raises(DamagedStoreError, match="is damaged: array 'host', episode 0 cannot be read .it names "
                       "machine 0 of the store's attribute 'hosts', which has 'not a record' there."):
        summarize(tmp_path, [EvalTask("Lift", "s")], [5], [Protocol("greedy", True, 0.0)], np.array([10, 11, 12]))


def test_a_set_aside_store_is_no_longer_read(store, tmp_path):
    truncate(store / "zarr.json")
    store.rename(store.with_name(store.name + ".damaged"))
    check_stores(tmp_path)
    assert stored_keys(tmp_path, "Lift") == set()  # its episodes are run again


def test_the_error_crosses_ray_intact(store):
    truncate(store / "zarr.json")
    with pytest.raises(DamagedStoreError) as info:
        check_store(store)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is DamagedStoreError and str(again) == str(info.value)


def test_an_array_holding_fewer_episodes_than_committed_is_named(store):
    import zarr

    obs = zarr.open_group(store, mode="r+", zarr_format=3)["obs"]
    obs.resize((2, *obs.shape[1:]))  # 3 committed
    with pytest.raises(DamagedStoreError, match=r"array 'obs' cannot be read \(it holds 2 episodes, the store "
                                                r"committed 3\)"):
        check_store(store)


@pytest.mark.parametrize("length", [0, SPEC.horizon + 1])
def test_an_episode_length_outside_the_stores_steps_is_named(store, length):
    import zarr

    zarr.open_group(store, mode="r+", zarr_format=3)["length"][1] = length
    with pytest.raises(DamagedStoreError, match=rf"array 'length', episode 1 \(chunk length/c/1\) cannot be read "
                                                rf"\(length {length} outside \[1, {SPEC.horizon}\]"):
        check_store(store)


def test_a_chunk_file_longer_than_its_blosc_header_says_is_named(store):
    chunk = store / "actions" / "c" / "1" / "0" / "0" / "0"
    size = chunk.stat().st_size
    chunk.write_bytes(chunk.read_bytes() + b"\0" * 5)
    with pytest.raises(DamagedStoreError, match=rf"array 'actions', episode 1 .* holds {size + 5} bytes, its Blosc "
                                                rf"header {size}"):
        check_store(store)


def test_a_long_cause_is_cut_to_200_characters_on_one_line(tmp_path):
    error = damaged_store(tmp_path / "rank0.zarr", "array 'obs'", "x" * 150 + "\n" + "y" * 150)
    assert error.cause == "x" * 150 + " " + "y" * 46 + "..."
    assert len(error.cause) == 200 and "\n" not in str(error)
