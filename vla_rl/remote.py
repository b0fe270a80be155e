"""The client side of remote environments: :class:`RobotClient` connects any gymnasium environment
to a run whose ``simulator.name`` is ``remote`` (the protocol: :mod:`simulators.remote_env`).

On the robot workstation (or a simulator host)::

    from vla_rl.remote import RobotClient

    env = MyRobotEnv()  # a gymnasium.Env: Box state (or a Dict of "state" and "<camera>_image")
    RobotClient(env, "ws://trainer-host:8765", token=os.environ["VLA_RL_REMOTE_TOKEN"]).run()

or, for a simulator this package has, ``vla-rl remote-env robosuite_lift --connect
ws://trainer-host:8765 --num-envs 4 [KEY=VALUE ...]``.

The environment's ``reset(seed=init_state_id)`` starts each episode (a simulator reproduces the
run's initial state; a robot may ignore it), its ``step`` runs each action of a chunk until the
episode ends, and its ``info`` says ``success`` (or ``is_success``, gymnasium-robotics' key; and
``invalid``: the episode must not be scored,
e.g. a person stopped the robot). An exception inside the environment is sent to the trainer as
an error (that episode is lost) and the client goes on. Disconnected, the client connects again
after ``retry_s`` (the trainer counts the episode it was running as lost); a chunk whose
connection closes while it runs (the trainer gave up waiting for it, or stopped) or whose client
is stopped is not executed further: no action is taken for an episode the trainer has dropped. A
refused token or an environment that does not fit the run stops it with :class:`RemoteRefused`.

This module needs only numpy, gymnasium, msgpack and websockets.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from vla_rl_core import wire
from vla_rl_core.auth import api_key_headers
from vla_rl_core.env_spec import executed_actions, info_success

logger = logging.getLogger(__name__)

STATE_KEY, IMAGE_SUFFIX = "state", "_image"


class RemoteRefused(RuntimeError):
    """The trainer refused this client (wrong token, or an environment that does not fit the run), or the
    server is not a remote environment hub."""


class _Dropped(Exception):
    """A chunk stopped before its ``left`` of ``sent`` actions: the trainer no longer waits for it."""

    def __init__(self, left: int, sent: int) -> None:
        super().__init__(left, sent)
        self.left, self.sent = left, sent


class RobotClient:
    """Serve one gymnasium environment to a run's remote environment hub.

    Args:
        env: the environment: a ``Box`` observation (the state) or a ``Dict`` with ``state`` and
            ``<camera>_image`` uint8 ``(H, W, 3)`` entries; a ``Box`` action space (actions are
            clipped to its bounds); ``step`` reports ``info["success"]`` (or ``"is_success"``).
        uri: the hub's address, ``ws://HOST:PORT`` (the run's ``simulator.env.host`` / ``port``).
        token: the run's shared token (``VLA_RL_REMOTE_TOKEN`` on the trainer), or None.
        name: how the trainer's log names this client (default: the remote address).
        retry_s: seconds between connection attempts.

    Raises:
        ValueError: the environment's spaces are not the ones above.
    """

    def __init__(self, env: gym.Env, uri: str = "ws://127.0.0.1:8765", token: str | None = None,
                 name: str | None = None, retry_s: float = 1.0) -> None:
        self.env, self.uri, self.token, self.name, self.retry_s = env, uri, token, name, retry_s
        self.hello = {"type": "hello", "name": name, **_sizes(env)}
        self.episodes = 0  # episodes started (resets served)
        self.error: Exception | None = None
        self.thread: threading.Thread | None = None

    def run(self, stop: threading.Event | None = None) -> None:
        """Connect and serve until ``stop`` is set (forever without one), connecting again after
        a disconnect.

        Raises:
            RemoteRefused: the hub refused the token or the environment.
        """
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.frames import CloseCode
        from websockets.sync.client import connect

        stop = stop or threading.Event()
        headers = api_key_headers(self.token)
        while not stop.is_set():
            try:
                with connect(self.uri, additional_headers=headers, compression=None, max_size=None,
                             open_timeout=10) as websocket:
                    self._session(websocket, stop)
            except InvalidStatus as err:
                if err.response.status_code == 401:
                    raise RemoteRefused(f"{self.uri} refused the token: {err.response.body.decode().strip()}") from None
                logger.warning("%s answered %s; connecting again in %g s", self.uri, err.response.status_code,
                               self.retry_s)
            except ConnectionClosed as err:
                if err.rcvd is not None and err.rcvd.code == CloseCode.MESSAGE_TOO_BIG:  # its episode is lost
                    logger.warning("%s closed the connection: a message of this client was larger than the hub "
                                   "takes (%s); check the observation's sizes; connecting again in %g s",
                                   self.uri, err.rcvd.reason, self.retry_s)
                else:
                    logger.info("no connection to %s (%s); connecting again in %g s", self.uri, err, self.retry_s)
            except (OSError, TimeoutError, InvalidHandshake) as err:
                # InvalidHandshake: a peer that closed (or answered garbage) before its HTTP reply,
                # as a hub restarting or a proxy in between does
                logger.info("no connection to %s (%s); connecting again in %g s", self.uri, err, self.retry_s)
            stop.wait(self.retry_s)

    def start(self, stop: threading.Event | None = None) -> threading.Thread:
        """:meth:`run` on a daemon thread (returned, also :attr:`thread`); what stopped it is in
        :attr:`error` (None while it runs or after ``stop``)."""

        def main() -> None:
            try:
                self.run(stop)
            except Exception as err:  # noqa: BLE001 (reported through self.error)
                self.error = err

        self.thread = threading.Thread(target=main, name=f"vla-rl-remote-{self.name or 'env'}", daemon=True)
        self.thread.start()
        return self.thread

    def _session(self, websocket, stop: threading.Event) -> None:
        from websockets.protocol import State

        websocket.send(wire.packb(self.hello))
        welcome = websocket.recv()
        if isinstance(welcome, str):
            raise RemoteRefused(welcome)
        try:
            welcome = wire.unpackb(welcome)
        except ValueError:
            welcome = None
        if not isinstance(welcome, dict) or welcome.get("type") != "welcome":
            raise RemoteRefused(f"{self.uri} is not a vla-rl remote environment hub (it answered the hello with "
                                f"{_described(welcome)}, not a welcome); connect to the hub of a run with "
                                "simulator.name=remote (its simulator.env.port), not to `vla-rl serve`'s policy server")
        logger.info("connected to %s (task %s)", self.uri, welcome.get("task"))
        while not stop.is_set():
            try:
                message = websocket.recv(timeout=0.2)
            except TimeoutError:
                continue
            request = wire.unpackb(message)
            try:
                answer = self._answer(request, lambda: websocket.state is State.OPEN and not stop.is_set())
            except _Dropped as dropped:
                logger.warning("the connection closed or the client stopped during a chunk: %s of its %s actions "
                               "not executed", dropped.left, dropped.sent)
                return
            except Exception as err:  # noqa: BLE001 (the environment's failure loses this episode only)
                logger.exception("the environment failed on a %s request", request.get("type"))
                websocket.send(f"{type(err).__name__}: {err}")
                continue
            websocket.send(wire.packb(answer))

    def _answer(self, request: dict, wanted: Callable[[], bool] | None = None) -> dict:
        """The answer to ``request``; ``wanted()`` says, before each action of a chunk, whether
        the trainer still waits for it (else :class:`_Dropped`; None: it always does)."""
        kind = request.get("type")
        if kind == "reset":
            obs, _ = self.env.reset(seed=int(request["init_state_id"]))
            self.episodes += 1
            return {"obs": _observation(obs)}
        if kind == "step":
            reward, success, invalid, steps = 0.0, False, False, 0
            terminated = truncated = False
            space = self.env.action_space
            actions = executed_actions(np.asarray(request["actions"], dtype=np.float32), space.low, space.high)
            for action in actions:
                if wanted is not None and not wanted():
                    raise _Dropped(len(actions) - steps, len(actions))
                obs, step_reward, terminated, truncated, info = self.env.step(action)
                reward += float(step_reward)
                invalid |= bool(info.get("invalid", False))
                success |= not invalid and info_success(info)  # an invalid episode is not scored
                steps += 1
                if terminated or truncated or invalid:
                    break
            return {"obs": _observation(obs), "reward": reward, "terminated": bool(terminated),
                    "truncated": bool(truncated), "success": success, "steps": steps, "invalid": invalid}
        raise ValueError(f"unknown request type {kind!r}")


def serve_envs(envs: list[gym.Env], uri: str, token: str | None = None, stop: threading.Event | None = None,
               retry_s: float = 1.0) -> list[RobotClient]:
    """One :class:`RobotClient` per environment, each running on a thread of its own
    (:meth:`RobotClient.start`) until ``stop`` is set."""
    clients = [RobotClient(env, uri, token, name=f"env{i}", retry_s=retry_s) for i, env in enumerate(envs)]
    for client in clients:
        client.start(stop)
    return clients


def _sizes(env: gym.Env) -> dict[str, Any]:
    """The hello's sizes of ``env``'s spaces."""
    space = env.observation_space
    if isinstance(space, gym.spaces.Dict):
        if STATE_KEY not in space.spaces:
            raise ValueError(f"a Dict observation needs a {STATE_KEY!r} entry, got {sorted(space.spaces)}")
        state, images = space[STATE_KEY], {key: list(sub.shape) for key, sub in space.spaces.items()
                                           if key.endswith(IMAGE_SUFFIX)}
    else:
        state, images = space, {}
    if not isinstance(state, gym.spaces.Box) or len(state.shape) != 1:
        raise ValueError(f"the state must be a 1-D Box, got {state}")
    if not isinstance(env.action_space, gym.spaces.Box) or len(env.action_space.shape) != 1:
        raise ValueError(f"the action space must be a 1-D Box, got {env.action_space}")
    return {"state_dim": int(state.shape[0]), "action_dim": int(env.action_space.shape[0]), "images": images}


def _observation(obs: Any) -> dict[str, np.ndarray]:
    """The wire form of an observation: ``{"state": float32, "<camera>_image": uint8, ...}``."""
    if isinstance(obs, dict):
        return {key: np.asarray(value, dtype=np.float32 if key == STATE_KEY else None)
                for key, value in obs.items() if key == STATE_KEY or key.endswith(IMAGE_SUFFIX)}
    return {STATE_KEY: np.asarray(obs, dtype=np.float32)}


def _described(message: Any) -> str:
    """A received message, in a few words, for an error line."""
    if isinstance(message, dict):
        return f"a message of keys {sorted(map(str, message))[:6]}"
    return "bytes that are not msgpack" if message is None else f"a {type(message).__name__}"
