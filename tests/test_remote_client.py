"""``vla_rl.remote.RobotClient`` (``vla-rl remote-env``) connects again whatever ended a connection
attempt, short of the hub refusing its token or environment."""

from __future__ import annotations

import socket
import threading

import gymnasium as gym
import numpy as np
import pytest

from vla_rl.cli import main
from vla_rl.remote import RobotClient


class PointEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_a_peer_that_closes_during_the_handshake_is_tried_again():
    """A listener that accepts and closes before any HTTP reply (a hub restarting, a proxy):
    websockets raises InvalidMessage, which used to end the client's thread for good."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    attempts = []

    def accept_and_close():
        for _ in range(3):
            connection, _ = listener.accept()
            connection.recv(4096)
            attempts.append(1)
            connection.close()

    acceptor = threading.Thread(target=accept_and_close, daemon=True)
    acceptor.start()
    client = RobotClient(PointEnv(), f"ws://127.0.0.1:{listener.getsockname()[1]}", retry_s=0.05)
    stop = threading.Event()
    thread = client.start(stop)
    acceptor.join(timeout=20)
    try:
        assert len(attempts) == 3  # it came back after each closed handshake
        assert thread.is_alive() and client.error is None
    finally:
        stop.set()
        thread.join(timeout=20)
        listener.close()
    assert not thread.is_alive() and client.error is None


@pytest.mark.parametrize("uri, message", [
    ("notauri", "--connect notauri: notauri isn't a valid URI"),  # exit 1 without the option's name
    ("ws://127.0.0.1:99999", "--connect ws://127.0.0.1:99999: Port out of range"),  # a traceback
    ("ws://no-such-host.invalid:8765", "host 'no-such-host.invalid' does not resolve"),  # retried forever
])
def test_a_hub_address_that_cannot_work_is_refused_before_any_environment(uri, message, capsys, monkeypatch):
    import simulators

    def no_such_host(host, *args, **kwargs):  # no query leaves the machine (loopback only in tests)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(simulators, "make_env", lambda *a, **k: pytest.fail("an environment was made"))
    monkeypatch.setattr(socket, "getaddrinfo", no_such_host)
    assert main(["remote-env", "robosuite_lift", "--connect", uri]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("refusal, message", [
    ("token", "refused the token: bad token"),
    ("environment", "this run's environments have state_dim 7, the client 3"),
    # `vla-rl serve`'s policy server sends its metadata first (openpi's protocol): the client took
    # it for a welcome, then failed on the server's text reply with "not a msgpack-numpy message"
    ("policy server", "is not a vla-rl remote environment hub (it answered the hello with a message of keys "
                      "['action_dim', 'chunk_size'], not a welcome)"),
])
def test_a_refused_client_exits_as_a_user_error_in_one_line(refusal, message, capsys, monkeypatch):
    """A hub that refuses the token (HTTP 401) or the environment (a text welcome), or a server
    that is not a hub, stops ``vla-rl remote-env`` with status 2 (the user's input), one line, as
    the address checks do (it was 1)."""
    from websockets.sync.server import serve

    import simulators
    from vla_rl_core import wire

    def process_request(connection, request):
        return connection.respond(401, "bad token\n") if refusal == "token" else None

    def handler(websocket):
        if refusal == "policy server":
            websocket.send(wire.packb({"action_dim": 7, "chunk_size": 4}))
        websocket.recv()  # the hello
        websocket.send("this run's environments have state_dim 7, the client 3")

    monkeypatch.setattr(simulators, "make_env", lambda *a, **k: PointEnv())
    with serve(handler, "127.0.0.1", 0, process_request=process_request) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        uri = f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        assert main(["remote-env", "robosuite_lift", "--num-envs", "2", "--connect", uri]) == 2
        server.shutdown()
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


PLUG_IN = '''
from dataclasses import dataclass

import gymnasium as gym
import numpy as np

from simulators.registry import SIMULATORS


@dataclass
class ToyConfig:
    size: int = 3


@SIMULATORS.register("toy_remote_point")
class ToyPoint(gym.Env):
    config_class = ToyConfig

    def __init__(self, config):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (config.size,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
'''


def test_remote_env_serves_a_plug_in_simulator_it_imports(tmp_path, capsys, monkeypatch):
    """``vla-rl remote-env`` knew only the built-in simulators: a plug-in one (docs/extending.md),
    which a run imports with run.imports, was an unknown simulator. ``--import`` imports it first;
    here the hub refuses its environment, which the client can only hear once it made one."""
    from websockets.sync.server import serve

    (tmp_path / "toy_remote_sim.py").write_text(PLUG_IN)
    (tmp_path / "toy_broken_sim.py").write_text("raise RuntimeError('half written')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    hellos = []

    def handler(websocket):
        hellos.append(websocket.recv())
        websocket.send("this run's environments have state_dim 7, the client 5")

    with serve(handler, "127.0.0.1", 0) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        uri = f"ws://127.0.0.1:{server.socket.getsockname()[1]}"
        assert main(["remote-env", "toy_remote_point", "--connect", uri]) == 2
        assert "unknown simulator 'toy_remote_point'" in capsys.readouterr().err
        assert main(["remote-env", "toy_remote_point", "--import", "toy_broken_sim", "--connect", uri]) == 2
        err = capsys.readouterr().err
        assert err.strip() == "error: --import toy_broken_sim: cannot import it: RuntimeError: half written", err
        assert main(["remote-env", "toy_remote_point", "size=5", "--import", "toy_remote_sim", "--connect", uri]) == 2
        server.shutdown()
    err = capsys.readouterr().err
    assert "state_dim 7, the client 5" in err and len(err.strip().splitlines()) == 1 and len(hellos) == 1
    # a batched simulator (docs/extending.md's point_mass shape) hosts many environments per object
    (tmp_path / "toy_batched_sim.py").write_text(
        "from simulators.registry import SIMULATORS\nfrom toy_remote_sim import ToyConfig\n"
        "SIMULATORS.register('toy_batched')(type('Batched', (), {'config_class': ToyConfig}))\n")
    assert main(["remote-env", "toy_batched", "--import", "toy_batched_sim", "--connect", "ws://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.strip() == ("error: toy_batched: a batched simulator (Batched steps all its "
                                               "environments at once); vla-rl remote-env serves gymnasium Env "
                                               "simulators, one environment per connection")


class ReachEnv(PointEnv):
    """Reaches its goal at the second step, and says so under gymnasium-robotics' key."""

    def reset(self, *, seed=None, options=None):
        self.steps = 0
        return np.zeros(3, np.float32), {}

    def step(self, action):
        self.steps += 1
        self.received = [*getattr(self, "received", []), np.asarray(action).tolist()]
        return np.zeros(3, np.float32), 0.0, self.steps == 2, False, {"is_success": self.steps == 2}


def test_a_client_reports_is_success_and_clips_actions_to_its_bounds():
    """Success under ``is_success`` was read as a failure, silently (``info.get("success", False)``)."""
    env = ReachEnv()
    client = RobotClient(env, "ws://127.0.0.1:1")
    client._answer({"type": "reset", "init_state_id": 0})
    actions = np.array([[3.0, -0.5], [0.25, -4.0], [0.0, 0.0]], np.float32)
    answer = client._answer({"type": "step", "actions": actions})
    assert answer["success"] is True and answer["steps"] == 2 and answer["terminated"] is True
    assert env.received == [[1.0, -0.5], [0.25, -1.0]]  # PointEnv's Box(-1, 1)


def test_an_episode_marked_invalid_needs_no_success_key():
    class StoppedEnv(PointEnv):
        def reset(self, *, seed=None, options=None):
            return np.zeros(3, np.float32), {}

        def step(self, action):  # a person stopped the robot: the episode is not scored
            return np.zeros(3, np.float32), 0.0, False, False, {"invalid": True}

    client = RobotClient(StoppedEnv(), "ws://127.0.0.1:1")
    client._answer({"type": "reset", "init_state_id": 0})
    answer = client._answer({"type": "step", "actions": np.zeros((2, 2), np.float32)})
    assert answer["invalid"] is True and answer["success"] is False and answer["steps"] == 1


class ScriptedEnv(gym.Env):
    """A Dict observation (state, a camera, and an entry a client does not send); ``step`` ``i``
    (from 1) gives reward ``i`` and truncates at ``truncate_at``; ``reset`` records its seed."""

    observation_space = gym.spaces.Dict({"state": gym.spaces.Box(-1.0, 1.0, (3,), np.float32),
                                         "front_image": gym.spaces.Box(0, 255, (2, 2, 3), np.uint8),
                                         "depth": gym.spaces.Box(0.0, 1.0, (2, 2), np.float32)})
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, truncate_at: int = 0) -> None:
        self.truncate_at, self.steps, self.seeds = truncate_at, 0, []

    def observation(self):
        return {"state": np.full(3, self.steps, np.float64), "front_image": np.zeros((2, 2, 3), np.uint8),
                "depth": np.zeros((2, 2), np.float32)}

    def reset(self, *, seed=None, options=None):
        self.seeds.append(seed)
        self.steps = 0
        return self.observation(), {}

    def step(self, action):
        self.steps += 1
        return self.observation(), float(self.steps), False, self.steps == self.truncate_at, {"success": False}


def test_a_reset_starts_from_the_requested_initial_state_and_sends_state_and_images_only():
    env = ScriptedEnv()
    answer = RobotClient(env, "ws://127.0.0.1:1")._answer({"type": "reset", "init_state_id": 17})
    assert env.seeds == [17]
    assert sorted(answer["obs"]) == ["front_image", "state"] and answer["obs"]["state"].dtype == np.float32


def test_a_chunks_rewards_are_summed_and_a_truncation_ends_it():
    env = ScriptedEnv(truncate_at=2)
    client = RobotClient(env, "ws://127.0.0.1:1")
    client._answer({"type": "reset", "init_state_id": 0})
    answer = client._answer({"type": "step", "actions": np.zeros((4, 2), np.float32)})
    assert (answer["steps"], answer["reward"], answer["truncated"], answer["terminated"]) == (2, 3.0, True, False)
    assert answer["obs"]["state"].tolist() == [2.0, 2.0, 2.0]


def test_a_chunk_the_trainer_no_longer_waits_for_stops_where_it_is():
    from vla_rl.remote import _Dropped

    env = ScriptedEnv()
    client = RobotClient(env, "ws://127.0.0.1:1")
    client._answer({"type": "reset", "init_state_id": 0})
    wanted = iter([True, False])
    with pytest.raises(_Dropped) as dropped:
        client._answer({"type": "step", "actions": np.zeros((3, 2), np.float32)}, lambda: next(wanted))
    assert (dropped.value.left, dropped.value.sent, env.steps) == (2, 3, 1)


def test_a_state_that_is_not_a_vector_is_refused():
    class ImageStateEnv(PointEnv):
        observation_space = gym.spaces.Box(-1.0, 1.0, (3, 2), np.float32)

    with pytest.raises(ValueError, match="the state must be a 1-D Box"):
        RobotClient(ImageStateEnv(), "ws://127.0.0.1:1")


def test_every_served_environment_presents_the_token(monkeypatch):
    from vla_rl import remote

    monkeypatch.setattr(remote.RobotClient, "start", lambda self, stop=None: None)
    clients = remote.serve_envs([PointEnv(), PointEnv()], "ws://127.0.0.1:1", token="s3cret")
    assert [(c.token, c.name) for c in clients] == [("s3cret", "env0"), ("s3cret", "env1")]
