"""The live policy's video of each evaluation of a run (``videos/<tag>.mp4``) is rendered in
environments of its own, created at the first evaluation and kept for the next ones (creating
them took 6.6-7.1 s of every evaluation on this 2-core machine), closed with the session or
after a failure."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import simulators.pool
from vla_rl.dag.loader import load_template
from vla_rl.evaluation import embodied
from vla_rl.evaluation.embodied import EmbodiedEvaluation


class CountingPool:
    """Stands in for SimulatorPool: counts the pools made and closed."""

    made: list[CountingPool] = []

    def __init__(self, simulator, env, **options) -> None:
        self.env, self.options, self.closed = env, options, 0
        CountingPool.made.append(self)

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def session(tmp_path, monkeypatch):
    CountingPool.made = []
    monkeypatch.setattr(simulators.pool, "SimulatorPool", CountingPool)
    config = load_template("embodied_srpo", ["eval.video_episodes=2", "eval.video_size=32"]).config
    session = EmbodiedEvaluation.__new__(EmbodiedEvaluation)  # the worker's session, without its simulators
    session.res = SimpleNamespace(policy=None, device=torch.device("cpu"), rank=0)
    session.config, session.eval_dir, session.tag = config, tmp_path, "warm_start"
    session._pool, session._pool_task, session._pool_task_id, session._owns_pool = None, None, None, False
    session._video_pool = None
    return session


def test_the_video_environments_are_made_once_and_closed_with_the_session(session, monkeypatch):
    calls = []

    def record(policy, pool, ids, path, fps, generator, task_ids=None):
        calls.append((pool, ids.tolist(), path.name))
        return {"video_successes": len(calls) - 1, "video_episodes": len(ids)}

    monkeypatch.setattr(embodied, "record_video", record)
    assert session._record_live_video() == {"video/warm_start_successes": 0.0}
    session.tag = "step_00000010"
    assert session._record_live_video() == {"video/step_00000010_successes": 1.0}
    (pool,) = CountingPool.made
    assert pool.options["envs_per_actor"] == 2 and pool.env["render_size"] == 32 and pool.closed == 0
    offset = session.config.eval.init_state_offset
    assert calls == [(pool, [offset, offset + 1], "warm_start.mp4"), (pool, [offset, offset + 1], "step_00000010.mp4")]
    session.close()
    session.close()
    assert pool.closed == 1 and session._video_pool is None


def test_a_failed_video_closes_its_environments_and_the_next_makes_new_ones(session, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("an actor died")

    monkeypatch.setattr(embodied, "record_video", fail)
    with pytest.raises(RuntimeError, match="an actor died"):
        session._record_live_video()
    assert [pool.closed for pool in CountingPool.made] == [1]
    monkeypatch.setattr(embodied, "record_video", lambda *args, **kwargs: {"video_successes": 2})
    assert session._record_live_video() == {"video/warm_start_successes": 2.0}
    assert [pool.closed for pool in CountingPool.made] == [1, 0]
