"""A robosuite Lift episode run through PyPI's ``openpi-client`` against ``vla-rl serve`` is the
episode ``vla-rl eval`` runs on the same initial state: the same actions, step for step, and the
same success (the engine's evaluation through Ray, a DAG worker and simulator actors on one side;
a plain gymnasium loop with openpi's ``ActionChunkBroker`` on the other). The policy is served on
the device the evaluation ran on (``VLA_RL_TEST_DEVICE``), where both compute as the run's
rollouts do (on CUDA: bfloat16 autocast).

The loop steps the simulator with the evaluation's actions and asks the server for its action at
every observation. On the CPU the two are equal bit for bit, so the loop is the closed loop of the
served policy, and that is the episode the evaluation ran. On an accelerator the evaluation
scored its 3 episodes in one batch and the server one observation at a time: the GPU's matrix
kernels may round otherwise for other batch shapes (bfloat16 outputs differ by a unit in the last
place), which a closed loop would amplify along the episode, so there each served action is held
to the stored one within bfloat16's rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

# absent on hosts without them (the GPU image has neither): the module is skipped, not a collection error
pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")
pytest.importorskip("openpi_client", reason="openpi-client is not installed (the test extra: pip install -e '.[test]')")
from devices import device_under_test
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from simulators.registry import make_env
from vla_rl.dag.loader import load_template
from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.serving.policy import load_served_policy
from vla_rl.serving.server import PolicyServer, server_thread

#: Tolerance of a served action against the evaluated one on an accelerator (absolute and relative):
#: bfloat16 keeps 8 significant bits (a unit in the last place: 2**-8 to 2**-7 of the value), and a
#: rounding of the hidden layer moves an action by a few such units.
ACCELERATOR_TOLERANCE = 2e-2


def test_a_served_lift_episode_is_the_evaluated_one(evaluated_lift_run):
    device = device_under_test()
    store_path = evaluated_lift_run / "eval" / "episodes" / "robosuite_lift" / "rank0.zarr"
    store = TrajectoryStore.open(store_path, read_only=True)
    config = load_template(evaluated_lift_run / "template.yaml").config
    served = load_served_policy(evaluated_lift_run, device=str(device))
    env = make_env(config.simulator.name, config.simulator.env_config())
    try:
        with server_thread(PolicyServer(served, port=0)) as server:
            client = WebsocketClientPolicy("127.0.0.1", server.port)
            for index in range(len(store)):
                episode = store.read_episode(index)
                broker = ActionChunkBroker(client, action_horizon=client.get_server_metadata()["action_horizon"])
                evaluated = episode["env_actions"][:, 0]  # (T, action_dim): chunks of one action
                executed = np.clip(evaluated, -1.0, 1.0)  # as Lift executed them, and the server sends them
                obs, _ = env.reset(seed=int(episode["init_state_id"]))
                served_actions, success, done = [], False, False
                while not done:
                    served_actions.append(broker.infer({"state": obs})["actions"])
                    obs, _, terminated, truncated, info = env.step(evaluated[len(served_actions) - 1])
                    success, done = success or info["success"], terminated or truncated
                assert len(served_actions) == int(episode["finish_step"]) == config.simulator.env_config().horizon == 30
                if device.type == "cpu":
                    np.testing.assert_array_equal(np.stack(served_actions), executed)
                else:
                    np.testing.assert_allclose(np.stack(served_actions), executed, rtol=ACCELERATOR_TOLERANCE,
                                               atol=ACCELERATOR_TOLERANCE)
                assert success == bool(episode["success"])
    finally:
        env.close()
    assert len(store) == 3
