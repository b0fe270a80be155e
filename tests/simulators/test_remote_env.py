"""Remote environments (simulators/remote_env.py, vla_rl/remote.py): a simulator pool of
``simulator.name: remote`` whose episodes run in RobotClients connected over websockets, on
loopback. The environments here are a small deterministic gymnasium environment (the protocol is
under test; tests/test_remote_training.py runs robosuite Lift this way)."""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from simulators.pool import SimulatorPool
from simulators.remote_config import RemoteEnvConfig
from simulators.remote_env import RemoteEnv
from vla_rl.remote import RemoteRefused, RobotClient, serve_envs
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.errors import RunStopped

TARGET = 4  # the walk succeeds when its position reaches TARGET


class WalkEnv(gym.Env):
    """State ``[position, seed]``; each action adds its sign to the position; success at TARGET.
    ``info["invalid"]`` when an action is exactly 9 (a person stopped the robot); an action of 7
    raises; an action of 5 takes ``slow_s`` seconds; an action of 3 observes a NaN (a sensor's
    glitch). A reset with seed 77 takes ``slow_s`` seconds (a robot homing); one with seed 66
    observes a NaN."""

    def __init__(self, state_dim: int = 2, slow_s: float = 0.0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
        self.action_space = gym.spaces.Box(-10.0, 10.0, (1,), np.float32)
        self.slow_s, self.position, self.seed_ = slow_s, 0, 0
        self.steps = 0  # actions executed, all episodes
        self.slow_steps: list[tuple[float, float]] = []  # (start, end) of each slow step

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.observation_space.shape, np.float32)
        obs[:2] = [self.position, self.seed_]
        return obs

    def reset(self, *, seed=None, options=None):
        self.position, self.seed_ = int(seed) % 3, int(seed)
        if seed == 77:
            time.sleep(self.slow_s)
        obs = self._obs()
        if seed == 66:
            obs[0] = np.nan
        return obs, {}

    def step(self, action):
        self.steps += 1
        value = float(action[0])
        if value == 7:
            raise RuntimeError("the gripper jammed")
        if value == 5:
            started = time.monotonic()
            time.sleep(self.slow_s)
            self.slow_steps.append((started, time.monotonic()))
        self.position += int(np.sign(value))
        success = self.position >= TARGET
        obs = self._obs()
        if value == 3:
            obs[1] = np.nan
        return obs, float(success), success, False, {"success": success, "invalid": value == 9}


def config(**fields) -> dict:
    return {"state_dim": 2, "action_dim": 1, "horizon": 6, "port": 0, "step_timeout_s": 2.0,
            "connect_timeout_s": 20.0, **fields}


@pytest.fixture()
def stop():
    event = threading.Event()
    yield event
    event.set()


def uri(pool: SimulatorPool) -> str:
    return f"ws://127.0.0.1:{pool.env_config.port}"


def test_a_remote_episode_is_the_environments_own(ray_on_loopback, stop):
    """Chunks go to the clients, which step their environment until the episode ends; the pool
    returns what stepping the environment here gives (observations, summed rewards, success,
    executed steps), and the trainer truncates at the horizon."""
    with SimulatorPool("remote", config(), num_actors=1, envs_per_actor=2) as pool:
        clients = serve_envs([WalkEnv(), WalkEnv()], uri(pool), stop=stop, retry_s=0.1)
        assert pool.spec().obs_dim == 2 and pool.spec().action_dim == 1
        obs = pool.reset(np.array([4, 2]))
        np.testing.assert_array_equal(obs, [[1, 4], [2, 2]])
        out = pool.collect(pool.submit(np.arange(2), np.array([[[1], [1], [1], [1]], [[-1], [-1], [-1], [-1]]],
                                                              np.float32)))
        local = WalkEnv()
        local.reset(seed=4)
        for _ in range(3):
            expected = local.step([1.0])
        np.testing.assert_array_equal(out["obs"][0], expected[0])  # succeeded after 3 of the 4 actions
        assert out["success"].tolist() == [True, False] and out["steps"].tolist() == [3, 4]
        assert out["reward"].tolist() == [1.0, 0.0] and out["terminated"].tolist() == [True, False]
        assert not out["lost"].any() and out["truncated"].tolist() == [False, False]
        # two more steps reach the horizon (6): the trainer truncates; only 2 of 4 actions are sent
        out = pool.collect(pool.submit(np.array([1]), np.full((1, 4, 1), -1, np.float32)))
        assert out["truncated"].tolist() == [True] and out["steps"].tolist() == [2]
        assert sum(client.episodes for client in clients) == 2


def test_the_environments_of_one_actor_run_their_chunks_at_the_same_time(ray_on_loopback, stop):
    """A simulator actor sends every remote environment its chunk before waiting for any: two
    half-second steps on two clients of one actor overlap in time (stepped one after the other,
    the second would start when the first ended)."""
    envs = [WalkEnv(slow_s=0.5), WalkEnv(slow_s=0.5)]
    with SimulatorPool("remote", config(), num_actors=1, envs_per_actor=2) as pool:
        serve_envs(envs, uri(pool), stop=stop, retry_s=0.1)
        pool.reset(np.arange(2))
        out = pool.collect(pool.submit(np.arange(2), np.full((2, 1, 1), 5, np.float32)))
    assert out["steps"].tolist() == [1, 1]
    (start_a, end_a), (start_b, end_b) = envs[0].slow_steps[0], envs[1].slow_steps[0]
    assert max(start_a, start_b) < min(end_a, end_b)


def test_lost_episodes_are_reported_and_the_clients_serve_again(ray_on_loopback, stop):
    """A client that errs, marks its episode invalid or does not answer in time loses that
    episode (``lost``, not a failure); the others go on, and every client serves the next reset
    (the one cut off for its silence connects again)."""
    with SimulatorPool("remote", config(step_timeout_s=1.0), num_actors=1, envs_per_actor=4) as pool:
        clients = serve_envs([WalkEnv(slow_s=3.0) for _ in range(4)], uri(pool), stop=stop, retry_s=0.1)
        pool.reset(np.arange(4))
        actions = np.array([[[1]], [[7]], [[9]], [[5]]], np.float32)  # fine, raises, invalid, too slow
        out = pool.collect(pool.submit(np.arange(4), actions))
        assert out["lost"].tolist() == [False, True, True, True]
        assert out["steps"].tolist() == [1, 0, 0, 0] and not out["success"].any()
        stats = hub_stats(pool)
        assert (stats["lost"], stats["invalid"]) == (2, 1)  # the error and the silence; the invalid one
        time.sleep(3.5)  # the slow client finishes its step, finds its connection closed, connects again
        obs = pool.reset(np.arange(4) + 10)
        assert obs[:, 1].tolist() == [10, 11, 12, 13]
        assert hub_stats(pool)["connected"] == 5 and all(client.error is None for client in clients)


def test_a_robot_stops_a_chunk_the_trainer_gave_up_on(ray_on_loopback, stop):
    """The hub drops a client that does not answer within step_timeout_s; the client executed the
    rest of its chunk anyway (a real robot moving for an episode nobody waits for). Now it checks
    its connection before each action: after the slow first action, the other three are not run."""
    env = WalkEnv(slow_s=1.5)
    with SimulatorPool("remote", config(step_timeout_s=0.5), num_actors=1, envs_per_actor=1) as pool:
        serve_envs([env], uri(pool), stop=stop, retry_s=0.1)
        pool.reset(np.array([0]))
        out = pool.collect(pool.submit(np.array([0]), np.array([[[5], [1], [1], [1]]], np.float32)))
        assert out["lost"].tolist() == [True]
        time.sleep(2.5)  # the slow action ends; the client finds its connection closed
        assert env.steps == 1 and env.position == 1
        assert pool.reset(np.array([4]))[0, 1] == 4  # it connected again and serves


def test_a_non_finite_observation_loses_its_episode_not_the_run(ray_on_loopback, stop):
    """A sensor's NaN stopped the whole training run with a Ray traceback blaming the actions; now
    that episode is lost (naming the client and the field), the others go on, and the client
    serves the next reset. A reset observing a NaN is passed over for another client."""
    with SimulatorPool("remote", config(), num_actors=1, envs_per_actor=2) as pool:
        serve_envs([WalkEnv() for _ in range(2)], uri(pool), stop=stop, retry_s=0.1)
        pool.reset(np.arange(2))
        out = pool.collect(pool.submit(np.arange(2), np.array([[[1]], [[3]]], np.float32)))
        assert out["lost"].tolist() == [False, True] and out["steps"].tolist() == [1, 0]
        assert np.isfinite(out["obs"]).all()
        np.testing.assert_array_equal(pool.reset(np.array([10, 11]))[:, 1], [10, 11])  # both serve again
    with SimulatorPool("remote", config(connect_timeout_s=2.0), num_actors=1, envs_per_actor=1) as pool:
        (client,) = serve_envs([WalkEnv()], uri(pool), stop=stop, retry_s=0.1)
        with pytest.raises(RunStopped, match=r"\(the last reset failed: remote environment \d+: obs\['state'\] "
                                               r"holds non-finite values"):
            pool.reset(np.array([66]))
        assert client.episodes == 1  # reset once, not again and again for 2 s (a robot homing each time)


class MalformedOutcomes(RobotClient):
    """Answers a chunk whose first action is 2 with the reward ``"abc"``, 4 with the success
    ``"false"`` (a string: ``bool("false")`` is True), 6 with a NaN reward, 8 with a reward list."""

    def _answer(self, request, wanted=None):
        answer = super()._answer(request, wanted)
        if request.get("type") == "step":
            field, value = {2: ("reward", "abc"), 4: ("success", "false"), 6: ("reward", float("nan")),
                            8: ("reward", [1.0])}.get(int(request["actions"][0, 0]), (None, None))
            if field is not None:
                answer[field] = value
        return answer


def test_an_outcome_with_malformed_fields_loses_its_episode_not_the_run(ray_on_loopback, stop):
    """A reward that is no number stopped the run (a ValueError traceback in the rollout node),
    and a success flag sent as the string "false" counted as a success; a NaN reward went into
    the returns. Each now loses that episode, naming the client and the field, and the client
    serves again."""
    with SimulatorPool("remote", config(), num_actors=1, envs_per_actor=5) as pool:
        clients = [MalformedOutcomes(WalkEnv(), uri(pool), name=f"env{i}", retry_s=0.1) for i in range(5)]
        for client in clients:
            client.start(stop)
        pool.reset(np.arange(5))
        out = pool.collect(pool.submit(np.arange(5), np.array([[[1]], [[2]], [[4]], [[6]], [[8]]], np.float32)))
        assert out["lost"].tolist() == [False, True, True, True, True]
        assert out["steps"].tolist() == [1, 0, 0, 0, 0] and not out["success"].any()
        assert hub_stats(pool)["lost"] == 0  # the hub delivered the answers; the environments lost the episodes
        np.testing.assert_array_equal(pool.reset(np.arange(5) + 10)[:, 1], np.arange(5) + 10)  # all serve again
        assert all(client.error is None for client in clients)


def test_a_reset_slower_than_its_timeout_says_so(ray_on_loopback, stop):
    """A robot homing for longer than the reset's timeout: the run stopped saying that no client
    was free (4 were connected); now it names simulator.env.reset_timeout_s, which resets wait
    for apart from the chunks' step_timeout_s."""
    with SimulatorPool("remote", config(reset_timeout_s=0.5, connect_timeout_s=3.0), num_actors=1,
                       envs_per_actor=1) as pool:
        serve_envs([WalkEnv(slow_s=1.0)], uri(pool), stop=stop, retry_s=0.1)
        with pytest.raises(RunStopped, match=r"no remote environment reset within simulator.env.connect_timeout_s=3 s"
                                               r".*the last reset failed: remote environment \d+: no answer within "
                                               r"simulator.env.reset_timeout_s=0.5 s"):
            pool.reset(np.array([77]))
    with SimulatorPool("remote", config(step_timeout_s=0.5, connect_timeout_s=3.0), num_actors=1,
                       envs_per_actor=1) as pool:  # reset_timeout_s null: a reset waits step_timeout_s
        serve_envs([WalkEnv(slow_s=1.0)], uri(pool), stop=stop, retry_s=0.1)
        with pytest.raises(RunStopped, match=r"no answer within simulator.env.step_timeout_s=0.5 s"):
            pool.reset(np.array([77]))
    with SimulatorPool("remote", config(reset_timeout_s=5.0, step_timeout_s=0.5), num_actors=1,
                       envs_per_actor=1) as pool:
        serve_envs([WalkEnv(slow_s=1.0)], uri(pool), stop=stop, retry_s=0.1)
        assert pool.reset(np.array([77]))[0, 1] == 77  # 1 s of homing, within reset_timeout_s


def test_clients_without_the_token_or_that_do_not_fit_are_refused(ray_on_loopback, stop, monkeypatch, caplog):
    monkeypatch.setenv("VLA_RL_REMOTE_TOKEN", "s3cret")
    with SimulatorPool("remote", config(), num_actors=1, envs_per_actor=1) as pool:
        with pytest.raises(RemoteRefused, match="refused the token"):
            RobotClient(WalkEnv(), uri(pool)).run(stop)
        with pytest.raises(RemoteRefused, match="refused the token"):
            RobotClient(WalkEnv(), uri(pool), token="guess").run(stop)
        with pytest.raises(RemoteRefused, match=r"does not fit this run: state_dim 3 \(this run: 2\)"):
            RobotClient(WalkEnv(state_dim=3), uri(pool), token="s3cret").run(stop)
        client = RobotClient(WalkEnv(), uri(pool), token="s3cret", retry_s=0.1)
        client.start(stop)
        np.testing.assert_array_equal(pool.reset(np.array([5])), [[2, 5]])
        assert hub_stats(pool)["refused"] == 3 and client.error is None


def test_a_reset_without_clients_says_where_to_connect(ray_on_loopback):
    # RunStopped: the driver prints its message alone (it printed it under 88 lines of Ray traceback)
    with SimulatorPool("remote", config(connect_timeout_s=0.5), num_actors=1, envs_per_actor=1) as pool:
        with pytest.raises(RunStopped, match=r"no remote environment was free within simulator.env.connect_"
                                               r"timeout_s=0.5 s: connect clients .* to ws://127.0.0.1:\d+"):
            pool.reset(np.array([0]))


def test_the_hub_address_is_checked_before_any_worker_starts_it():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(ComponentConfigError, match=f"cannot listen on 127.0.0.1:{port}") as error:
            RemoteEnv.check_config(RemoteEnvConfig(state_dim=2, action_dim=1, port=port))
        assert error.value.field == "simulator.env.port"
    RemoteEnv.check_config(RemoteEnvConfig(state_dim=2, action_dim=1, port=port))  # free again
    RemoteEnv.check_config(RemoteEnvConfig(state_dim=2, action_dim=1, port=0))
    with pytest.raises(ComponentConfigError) as error:  # an address of another machine
        RemoteEnv.check_config(RemoteEnvConfig(state_dim=2, action_dim=1, host="203.0.113.9", port=port))
    assert error.value.field == "simulator.env.host"


def test_config_errors_name_the_field():
    from simulators.registry import build_env_config

    with pytest.raises(ComponentConfigError, match="state_dim must be a positive integer") as error:
        build_env_config("remote", {"action_dim": 1})
    assert error.value.field == "simulator.env.state_dim"
    with pytest.raises(ComponentConfigError, match="port must be in") as error:
        RemoteEnvConfig(state_dim=2, action_dim=1, port=70000)
    assert error.value.field == "port"
    env = RemoteEnv(RemoteEnvConfig(state_dim=3, action_dim=2, cameras=["front"], camera_size=8))
    assert env.observation_space["front_image"].shape == (8, 8, 3) and env.action_space.shape == (2,)


def hub_stats(pool: SimulatorPool) -> dict[str, int]:
    """The counts of the pool's hub (RemoteHub.stats)."""
    import ray

    return ray.get(ray.get_actor(pool.env_config.hub).stats.remote())


def test_a_connection_that_leaves_before_its_hello_is_no_refusal(caplog):
    """A port probe (connects, says nothing, leaves) is logged in one line; it used to be counted as
    a refused environment with an ERROR traceback (the refusal was sent to a closed socket)."""
    import asyncio
    import logging

    from websockets.sync.client import connect

    from simulators.remote_hub import _HubServer

    hub = _HubServer(RemoteEnvConfig(**config()), None)
    loop, started, closing = asyncio.new_event_loop(), threading.Event(), threading.Event()

    async def run_hub():
        serving = asyncio.ensure_future(hub.serve(started))
        while not closing.is_set():
            await asyncio.sleep(0.02)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)  # the server closes

    runner = threading.Thread(target=loop.run_until_complete, args=(run_hub(),), daemon=True)
    runner.start()
    assert started.wait(20)
    with caplog.at_level(logging.INFO):
        connect(f"ws://127.0.0.1:{hub.port}").close()
        deadline = time.monotonic() + 10
        while "closed before its hello" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    assert "closed before its hello" in caplog.text
    stats = asyncio.run_coroutine_threadsafe(hub.stats(), loop).result(10)
    assert stats["refused"] == stats["connected"] == stats["clients"] == 0
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    closing.set()
    runner.join(10)
    loop.close()
