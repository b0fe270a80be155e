"""A robosuite Lift episode run through PyPI's ``openpi-client`` against ``vla-rl serve`` is the
episode ``vla-rl eval`` runs on the same initial state: the same actions, step for step, and the
same success (the engine's evaluation through Ray, a DAG worker and simulator actors on one side;
a plain gymnasium loop with openpi's ``ActionChunkBroker`` on the other). The policy is served on
the device the evaluation ran on (``VLA_RL_TEST_DEVICE``), where both compute as the run's
rollouts do (on CUDA: bfloat16 autocast)."""

from __future__ import annotations

import numpy as np
import pytest

# absent on hosts without them (the GPU image has neither): the module is skipped, not a collection error
pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")
pytest.importorskip("openpi_client", reason="openpi-client is not installed (the test extra: pip install -e '.[test]')")
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from devices import device_under_test
from simulators.registry import make_env
from vla_rl.dag.loader import load_template
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.serving.policy import load_served_policy
from vla_rl.serving.server import PolicyServer, server_thread


def test_a_served_lift_episode_is_the_evaluated_one(evaluated_lift_run):
    store_path = evaluated_lift_run / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr"
    store = TrajectoryStore.open(store_path, read_only=True)
    config = load_template(evaluated_lift_run / "template.yaml").config
    served = load_served_policy(evaluated_lift_run, device=str(device_under_test()))
    env = make_env(config.simulator.name, config.simulator.env_config())
    try:
        with server_thread(PolicyServer(served, port=0)) as server:
            client = WebsocketClientPolicy("127.0.0.1", server.port)
            for index in range(len(store)):
                episode = store.read_episode(index)
                broker = ActionChunkBroker(client, action_horizon=client.get_server_metadata()["action_horizon"])
                obs, _ = env.reset(seed=int(episode["init_state_id"]))
                actions, success, done = [], False, False
                while not done:
                    action = broker.infer({"state": obs})["actions"]
                    obs, _, terminated, truncated, info = env.step(action)
                    actions.append(action)
                    success, done = success or info["success"], terminated or truncated
                assert len(actions) == int(episode["finish_step"]) == config.simulator.env_config().horizon == 30
                np.testing.assert_array_equal(np.stack(actions), episode["env_actions"][:, 0])
                assert success == bool(episode["success"])
    finally:
        env.close()
    assert len(store) == 3
