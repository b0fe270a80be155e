"""Tests for vla_rl.data.trajectory_store."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from vla_rl.data.trajectory_store import TrajectoryStore

FIELDS = {"obs": ((4,), np.float32), "actions": ((2,), np.float32), "image": ((3, 3), np.uint8)}
MAX_STEPS = 6


def make_episode(rng: np.random.Generator, length: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((length, 4)).astype(np.float32),
        "actions": rng.uniform(-1, 1, (length, 2)).astype(np.float32),
        "image": rng.integers(1, 255, (length, 3, 3), dtype=np.uint8),
    }


def assert_episode_equal(read: dict, episode: dict, length: int) -> None:
    assert read["length"] == length
    for name, array in episode.items():
        np.testing.assert_array_equal(read[name], array)
        assert read[name].dtype == FIELDS[name][1]


@pytest.fixture
def store(tmp_path):
    return TrajectoryStore.create(tmp_path / "demo.zarr", FIELDS, MAX_STEPS, attrs={"env": "lift"})


def test_round_trip_ragged_episodes(store, tmp_path):
    rng = np.random.default_rng(0)
    lengths = [3, 6, 1]
    episodes = [make_episode(rng, t) for t in lengths]
    for i, (episode, t) in enumerate(zip(episodes, lengths)):
        assert store.append_episode(episode, success=t > 2, init_state_id=10 + i) == i

    reopened = TrajectoryStore.open(tmp_path / "demo.zarr", read_only=True)
    assert len(reopened) == 3
    assert reopened.attrs == {"env": "lift"}
    for i, (episode, t) in enumerate(zip(episodes, lengths)):
        read = reopened.read_episode(i)
        assert_episode_equal(read, episode, t)
        assert read["success"] == (t > 2) and read["init_state_id"] == 10 + i
    assert_episode_equal(reopened.read_episode(-1), episodes[-1], 1)

    everything = reopened.read_all()
    np.testing.assert_array_equal(everything["length"], lengths)
    np.testing.assert_array_equal(everything["success"], [True, True, False])
    assert everything["success"].dtype == np.bool_
    np.testing.assert_array_equal(everything["init_state_id"], [10, 11, 12])
    assert everything["obs"].shape == (3, MAX_STEPS, 4)
    assert everything["image"].shape == (3, MAX_STEPS, 3, 3)
    for i, (episode, t) in enumerate(zip(episodes, lengths)):
        np.testing.assert_array_equal(everything["actions"][i, :t], episode["actions"])
        assert not everything["actions"][i, t:].any()  # zero padding


def test_layout_one_episode_per_chunk_blosc_zstd(store):
    store.append_episode(make_episode(np.random.default_rng(0), 2))
    array = zarr.open_group(store.path, mode="r")["obs"]
    assert array.chunks == (1, MAX_STEPS, 4)
    (codec,) = array.compressors
    assert type(codec).__name__ == "BloscCodec" and codec.cname.value == "zstd"


def test_float64_input_is_cast_and_read_only_blocks_appends(store):
    episode = make_episode(np.random.default_rng(0), 2)
    episode["obs"] = episode["obs"].astype(np.float64)
    store.append_episode(episode)
    assert store.read_episode(0)["obs"].dtype == np.float32
    with pytest.raises(PermissionError, match="read-only"):
        TrajectoryStore.open(store.path, read_only=True).append_episode(episode)


def test_update_attrs_keeps_the_other_entries_and_the_episodes(store):
    episode = make_episode(np.random.default_rng(0), 2)
    store.append_episode(episode, success=True)
    store.update_attrs({"hosts": [{"cpu": "a"}]})
    store.update_attrs({"hosts": [{"cpu": "a"}, {"cpu": "b"}]})
    reopened = TrajectoryStore.open(store.path, read_only=True)
    assert reopened.attrs == {"env": "lift", "hosts": [{"cpu": "a"}, {"cpu": "b"}]}
    assert len(reopened) == 1 and bool(reopened.read_episode(0)["success"])  # the schema's commit is intact
    with pytest.raises(PermissionError, match="read-only"):
        reopened.update_attrs({"env": "x"})
    assert TrajectoryStore.open(store.path).attrs["env"] == "lift"


@pytest.mark.parametrize("fail_at", range(6))  # 3 fields + 1 scalar + length + the commit
def test_interrupted_append_loses_and_exposes_nothing(store, monkeypatch, fail_at):
    rng = np.random.default_rng(1)
    first = make_episode(rng, 2)
    store.append_episode(first, success=True)

    calls = {"n": 0}
    original_setitem = zarr.Array.__setitem__
    original_commit = zarr.Group.update_attributes

    def maybe_crash():
        if calls["n"] == fail_at:
            raise RuntimeError("simulated crash")
        calls["n"] += 1

    def flaky_setitem(self, key, value):
        maybe_crash()
        original_setitem(self, key, value)

    def flaky_commit(self, new_attributes):
        maybe_crash()
        return original_commit(self, new_attributes)

    monkeypatch.setattr(zarr.Array, "__setitem__", flaky_setitem)
    monkeypatch.setattr(zarr.Group, "update_attributes", flaky_commit)
    with pytest.raises(RuntimeError, match="simulated crash"):
        store.append_episode(make_episode(rng, MAX_STEPS), success=False)
    monkeypatch.undo()

    assert len(store) == 1
    reader = TrajectoryStore.open(store.path)
    assert len(reader) == 1
    assert reader.read_all()["obs"].shape == (1, MAX_STEPS, 4)
    with pytest.raises(IndexError, match="out of range"):
        reader.read_episode(1)
    assert_episode_equal(reader.read_episode(0), first, 2)

    # A later append (here by a fresh writer) overwrites the uncommitted slot in full.
    replacement = make_episode(rng, 3)
    assert reader.append_episode(replacement, success=True) == 1
    again = TrajectoryStore.open(store.path)
    assert len(again) == 2
    assert_episode_equal(again.read_episode(0), first, 2)
    assert_episode_equal(again.read_episode(1), replacement, 3)
    assert not again.read_all()["obs"][1, 3:].any()


def test_interrupted_first_append_can_change_scalars(store, monkeypatch):
    def crash(self, new_attributes):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(zarr.Group, "update_attributes", crash)
    with pytest.raises(RuntimeError):
        store.append_episode(make_episode(np.random.default_rng(0), 2), reward=1.5)
    monkeypatch.undo()
    reopened = TrajectoryStore.open(store.path)
    assert len(reopened) == 0 and reopened.scalars == {}
    reopened.append_episode(make_episode(np.random.default_rng(0), 2), success=True)
    assert set(TrajectoryStore.open(store.path).read_all()) == {*FIELDS, "success", "length"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda e: e.pop("actions"), r"missing \['actions'\]"),
        (lambda e: e.update(extra=np.zeros((2, 1))), r"unknown \['extra'\]"),
        (lambda e: e.update(obs=np.zeros((2, 5), np.float32)), r"field 'obs' has shape \(2, 5\)"),
        (lambda e: e.update(obs=np.zeros(2, np.float32)), r"field 'obs' has shape \(2,\)"),
        (lambda e: e.update(image=np.zeros((2, 3, 3), np.float32)), r"field 'image' has dtype"),
        (lambda e: e.update(actions=np.zeros((3, 2), np.float32)), "disagree on the episode"),
    ],
)
def test_episode_validation_names_field_and_file(store, change, message):
    episode = make_episode(np.random.default_rng(0), 2)
    change(episode)
    with pytest.raises(ValueError, match=message) as info:
        store.append_episode(episode)
    assert str(store.path) in str(info.value)
    assert len(store) == 0


def test_length_and_scalar_validation(store):
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="outside"):
        store.append_episode(make_episode(rng, MAX_STEPS + 1))
    with pytest.raises(ValueError, match="outside"):
        store.append_episode(make_episode(rng, 0))
    with pytest.raises(ValueError, match="scalar 'success' must be one bool or number"):
        store.append_episode(make_episode(rng, 2), success=[True, False])
    with pytest.raises(ValueError, match="scalar 'obs' has the name of a field"):
        store.append_episode(make_episode(rng, 2), obs=1)
    store.append_episode(make_episode(rng, 2), success=True, init_state_id=3)
    with pytest.raises(ValueError, match="differ from the store's"):
        store.append_episode(make_episode(rng, 2), success=True)
    with pytest.raises(ValueError, match="scalar 'init_state_id' has dtype float64"):
        store.append_episode(make_episode(rng, 2), success=True, init_state_id=2.5)


@pytest.mark.parametrize(
    ("fields", "max_steps", "message"),
    [
        ({}, 5, "at least one field"),
        ({"length": ((1,), np.int64)}, 5, "reserved"),
        ({"a/b": ((1,), np.float32)}, 5, "invalid field name"),
        ({"__meta": ((1,), np.float32)}, 5, "invalid field name '__meta'"),
        ({"obs": ((0,), np.float32)}, 5, "field 'obs' has a non-positive dimension"),
        ({"obs": ((2,), object)}, 5, "field 'obs' has dtype object"),
        ({"obs": (2, np.float32)}, 5, "field 'obs' must be declared as"),
        ({"obs": ((2,), np.float32)}, 0, "max_steps must be a positive int"),
        ({"obs": ((2,), np.float32)}, True, "max_steps must be a positive int, got True"),
    ],
)
def test_create_validation(tmp_path, fields, max_steps, message):
    with pytest.raises(ValueError, match=message) as info:
        TrajectoryStore.create(tmp_path / "bad.zarr", fields, max_steps)
    assert "bad.zarr" in str(info.value)


def test_create_and_open_errors(store, tmp_path):
    with pytest.raises(FileExistsError, match="demo.zarr"):
        TrajectoryStore.create(store.path, FIELDS, MAX_STEPS)
    assert len(TrajectoryStore.create(store.path, FIELDS, MAX_STEPS, overwrite=True)) == 0
    with pytest.raises(FileNotFoundError, match="missing.zarr"):
        TrajectoryStore.open(tmp_path / "missing.zarr")
    (tmp_path / "not_zarr").mkdir()
    with pytest.raises(ValueError, match="not_zarr is not a zarr"):
        TrajectoryStore.open(tmp_path / "not_zarr")
    zarr.open_group(tmp_path / "plain.zarr", mode="w")
    with pytest.raises(ValueError, match="plain.zarr is a zarr group but not a trajectory store"):
        TrajectoryStore.open(tmp_path / "plain.zarr")


def test_read_episode_reads_only_the_fields_asked_for(store):
    rng = np.random.default_rng(3)
    episode = make_episode(rng, 4)
    store.append_episode(episode, init_state_id=7)
    read = store.read_episode(0, fields=["obs"])
    assert set(read) == {"obs", "init_state_id", "length"} and read["length"] == 4
    np.testing.assert_array_equal(read["obs"], episode["obs"])
    with pytest.raises(KeyError, match="no field 'state'"):
        store.read_episode(0, fields=["state"])


def test_negative_indices_count_from_the_end_within_range(store):
    rng = np.random.default_rng(4)
    episodes = [make_episode(rng, length) for length in (2, 3)]
    for episode in episodes:
        store.append_episode(episode)
    assert_episode_equal(store.read_episode(-1), episodes[1], 3)
    assert_episode_equal(store.read_episode(-2), episodes[0], 2)
    for index in (-3, 2):
        with pytest.raises(IndexError, match=rf"episode {index} out of range \(2 committed\)"):
            store.read_episode(index)


def test_read_scalars_exposes_no_uncommitted_episode(store, monkeypatch):
    store.append_episode(make_episode(np.random.default_rng(5), 2), success=True)

    def crash(self, new_attributes):
        raise RuntimeError("simulated crash")

    monkeypatch.setattr(zarr.Group, "update_attributes", crash)  # every slot written, the commit lost
    with pytest.raises(RuntimeError):
        store.append_episode(make_episode(np.random.default_rng(6), 4), success=False)
    monkeypatch.undo()
    scalars = TrajectoryStore.open(store.path).read_scalars()
    assert set(scalars) == {"success", "length"}
    np.testing.assert_array_equal(scalars["success"], [True])
    np.testing.assert_array_equal(scalars["length"], [2])


def test_a_store_of_another_format_version_is_refused(store):
    group = zarr.open_group(store.path, mode="r+", zarr_format=3)
    group.update_attributes({"trajectory_store": {**group.attrs["trajectory_store"], "format_version": 2}})
    with pytest.raises(ValueError, match="demo.zarr: trajectory store format 2 is not supported \\(expected 1\\)"):
        TrajectoryStore.open(store.path)
