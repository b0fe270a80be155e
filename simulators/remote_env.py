"""Remote environments (``simulator.name: remote``): episodes that run in processes which connect
to the trainer, a robot workstation or a simulator on another host.

The trainer side is a **hub** (:mod:`simulators.remote_hub`): one websocket server per run (a Ray
actor named after its port, started by the first simulator pool that needs it,
:meth:`RemoteEnv.start_services`), bound to ``host:port`` (127.0.0.1 unless ``host`` says
otherwise; another address is logged as a warning).
Each process that connects (:class:`vla_rl.remote.RobotClient` wraps any gymnasium environment) is
one environment. A :class:`RemoteEnv` in a simulator actor claims a connected one at its first
reset and keeps it while it answers.

The protocol is msgpack with numpy arrays (:mod:`vla_rl_core.wire`, the format of openpi's
policy server), one binary message per request and per answer:

1. the client opens ``ws://HOST:PORT`` with the header ``Authorization: Api-Key TOKEN`` when the
   run has a token (``VLA_RL_REMOTE_TOKEN`` in the driver's environment);
   without the right one the hub answers 401 and logs it;
2. client: ``{"type": "hello", "name": str, "state_dim": int, "action_dim": int, "images":
   {"<camera>_image": [H, W, 3]}}``; hub: ``{"type": "welcome", "task": str, "horizon": int}``,
   or a text message saying what does not fit this run, and it closes the connection;
3. hub: ``{"type": "reset", "init_state_id": int, "task": str}``; client: ``{"obs": {"state":
   float32 (state_dim,), "<camera>_image": uint8 (H, W, 3), ...}}``;
4. hub: ``{"type": "step", "actions": float32 (chunk, action_dim)}``, the action chunk the policy
   chose (cut at the horizon); the client executes it until its episode ends and answers
   ``{"obs", "reward": float (summed), "terminated": bool, "truncated": bool, "success": bool,
   "steps": int (executed, 1..chunk), "invalid": bool}``. ``invalid: true`` marks an episode
   that must not be scored (a person stopped the robot); a text message is an error on the
   client's side.

An episode is **lost** (counted in ``rollout/lost_episodes``, never scored as a failure:
:class:`~simulators.stepping.EpisodeLost`) when its client disconnects, does not answer within
``step_timeout_s``, reports an error, answers what is not a msgpack-numpy dict or an outcome that
breaks the protocol (an observation of another shape or dtype, a non-finite state, executed steps
out of range: it stays free for another episode), or marks it invalid. A client that disconnects
may connect again: it is claimed at a later reset. A reset that fails the same ways (or takes
longer than ``reset_timeout_s``) tries another client; a reset waits up to ``connect_timeout_s``
for a client that resets (then the run stops with one line saying where to connect and why the
last reset failed): connect at least as many clients as the run has environments rolling out at
once.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import math
import os
import socket
import time
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from simulators.registry import SIMULATORS
from simulators.remote_config import RemoteEnvConfig
from simulators.remote_hub import LOST, RemoteHub
from simulators.stepping import ChunkedSteps, EpisodeLost
from vla_rl_core import keys
from vla_rl_core.components import ComponentConfigError
from vla_rl_core.errors import RunStopped

logger = logging.getLogger(__name__)

HUB_NAME = "vla_rl_remote_hub_{port}"
"""Ray actor name of the hub listening on a port."""
_SERIAL = itertools.count()


@SIMULATORS.register("remote")
class RemoteEnv(ChunkedSteps, gym.Env):
    """One environment of a remote client, claimed from the hub at the first reset (module docstring).

    Creating it contacts nothing; :meth:`reset` finds the hub (Ray actor ``config.hub``).

    Args:
        config: the run's :class:`RemoteEnvConfig` as the pool passes it (``hub`` set).
    """

    config_class: ClassVar[type] = RemoteEnvConfig
    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, config: RemoteEnvConfig) -> None:
        self.config = config
        state = gym.spaces.Box(-np.inf, np.inf, (config.state_dim,), np.float32)
        if config.cameras:
            images = {key: gym.spaces.Box(0, 255, tuple(shape), np.uint8) for key, shape in config.image_shapes.items()}
            self.observation_space = gym.spaces.Dict({keys.OBS_STATE: state, **images})
        else:
            self.observation_space = state
        self.action_space = gym.spaces.Box(-1.0, 1.0, (config.action_dim,), np.float32)
        self.horizon = config.horizon
        self.obs_layout = {keys.OBS_STATE: slice(0, config.state_dim)}
        self.render_mode = None
        self.instruction = config.instruction or config.task
        self._hub: Any = None
        self._client: int | None = None
        self._episode_step: int | None = None  # None: no running episode
        self._pending: tuple[int, Any] | None = None  # actions sent, the hub's answer (an object reference)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Start an episode on this environment's client (claiming one if it has none).

        A client that does not answer within ``reset_timeout_s`` (``step_timeout_s`` when null),
        disconnects, fails, or answers an observation that breaks the protocol is passed over and
        another claimed; one whose observation broke the protocol stays free for other episodes
        but is not reset again for this one.

        Raises:
            RunStopped: no client was free and reset within ``connect_timeout_s`` (the run stops
                with its message: where to connect, and why the last reset failed, if one did).
        """
        super().reset(seed=seed)
        deadline = time.monotonic() + self.config.connect_timeout_s
        request = {"type": "reset", "init_state_id": int(seed or 0), "task": self.config.task}
        failed, refused = None, set()  # why the last reset failed; clients whose observation broke the protocol
        while True:
            if self._client is None:
                self._client = self._call("claim", max(deadline - time.monotonic(), 0.0))
                if self._client in refused:  # not reset again (a robot homing again) for this episode
                    self._hub.release.remote(self._client)
                    self._client = None
                    if time.monotonic() < deadline:
                        time.sleep(min(1.0, deadline - time.monotonic()))  # until another client is free
                        continue
                if self._client is None:
                    raise RunStopped(
                        f"no remote environment {'was free' if failed is None else 'reset'} within "
                        f"simulator.env.connect_timeout_s="
                        f"{self.config.connect_timeout_s:g} s: connect clients (vla_rl.remote.RobotClient) to "
                        f"ws://{self.config.host}:{self.config.port}, at least as many as the episodes rolled out "
                        "at once" + ("" if failed is None else f" (the last reset failed: {failed})"))
            timeout, field = ((self.config.step_timeout_s, "step_timeout_s") if self.config.reset_timeout_s is None
                              else (self.config.reset_timeout_s, "reset_timeout_s"))
            answer = self._call("request", self._client, request, timeout, f"simulator.env.{field}")
            if LOST not in answer:
                try:
                    obs = self._observation(answer.get("obs"))
                except ValueError as err:  # still connected: free for another episode
                    self._hub.release.remote(self._client)
                    refused.add(self._client)
                    answer = {LOST: str(err)}
                else:
                    self._episode_step = 0
                    return obs, {}
            failed = answer[LOST]
            logger.warning("remote environment %d did not reset (%s); claiming another", self._client, failed)
            self._client = None

    def send_actions(self, actions: np.ndarray) -> None:
        """Send the chunk (cut at the horizon) to the client without waiting
        (:meth:`ChunkedSteps.send_actions`).

        Raises:
            RuntimeError: no running episode. ValueError: ``actions`` not ``(chunk, action_dim)``.
        """
        if self._episode_step is None:
            raise RuntimeError("no episode is running: call reset() first (the environment never auto-resets)")
        actions = np.asarray(actions, dtype=np.float32)
        if actions.ndim != 2 or actions.shape[1] != self.config.action_dim or len(actions) < 1:
            raise ValueError(f"actions must have shape (chunk, {self.config.action_dim}), got {actions.shape}")
        actions = actions[: self.horizon - self._episode_step]
        self._pending = (len(actions), self._submit("request", self._client, {"type": "step", "actions": actions},
                                                    self.config.step_timeout_s))

    def receive_outcome(self) -> tuple[Any, float, bool, bool, dict, int]:
        """The client's outcome of the sent chunk (:meth:`ChunkedSteps.receive_outcome`); the
        trainer truncates at ``horizon``.

        Raises:
            RuntimeError: no chunk was sent.
            EpisodeLost: the client disconnected, did not answer, failed, marked the episode
                invalid, or answered an outcome that breaks the protocol (naming the client and the
                field; the client is freed for another episode).
        """
        import ray

        if self._pending is None:
            raise RuntimeError("no chunk was sent: call send_actions() first")
        (sent, ref), self._pending = self._pending, None
        answer = ray.get(ref)
        if LOST in answer or answer.get("invalid"):
            self._episode_step = None
            if LOST in answer:
                self._client = None  # the hub dropped it, or freed it; a later reset claims a client
            raise EpisodeLost(answer.get(LOST, "the remote side marked the episode invalid"))
        steps = answer.get("steps")
        try:
            if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or not 1 <= steps <= sent:
                raise ValueError(f"remote environment {self._client}: 'steps' must be 1..{sent} (the actions sent), "
                                 f"got {steps!r}")
            obs = self._observation(answer.get("obs"))
            reward = self._reward(answer.get("reward", 0.0))
            terminated, truncated, success = (self._flag(answer, name) for name in ("terminated", "truncated",
                                                                                    "success"))
        except ValueError as err:  # a sensor's NaN, a client's bug: this episode is lost, not the run
            self._hub.release.remote(self._client)
            self._client, self._episode_step = None, None
            raise EpisodeLost(str(err)) from None
        self._episode_step += int(steps)
        truncated = not terminated and (truncated or self._episode_step >= self.horizon)
        if terminated or truncated:
            self._episode_step = None
        return obs, reward, terminated, truncated, {"success": success}, int(steps)

    def _reward(self, reward: Any) -> float:
        """The client's summed reward, a finite real number (checked)."""
        if isinstance(reward, (bool, np.bool_)) or not isinstance(reward, (int, float, np.integer, np.floating)):
            raise ValueError(f"remote environment {self._client}: 'reward' must be a number, got "
                             f"{type(reward).__name__}")
        if not math.isfinite(reward):
            raise ValueError(f"remote environment {self._client}: 'reward' is {float(reward)}, not finite")
        return float(reward)

    def _flag(self, answer: dict, name: str) -> bool:
        """The client's ``name`` flag, a bool (absent: False; checked: ``bool("false")`` is True)."""
        flag = answer.get(name, False)
        if not isinstance(flag, (bool, np.bool_)):
            raise ValueError(f"remote environment {self._client}: {name!r} must be true or false, got "
                             f"{type(flag).__name__}")
        return bool(flag)

    def close(self) -> None:
        """Give the client back to the hub."""
        if self._client is not None and self._hub is not None:
            self._hub.release.remote(self._client)
        self._client = None

    @staticmethod
    def check_config(config: RemoteEnvConfig) -> None:
        """Check, before any worker starts the hub, that ``host:port`` can be bound here (bound
        once and let go; a local run's hub listens on the driver's machine). Port 0 (a free one)
        is not checked.

        Raises:
            ComponentConfigError: naming ``simulator.env.port`` (the port is in use) or
                ``simulator.env.host`` (not an address of this machine).
        """
        if config.port == 0:
            return
        try:
            family, kind, proto, _, address = socket.getaddrinfo(config.host, config.port,
                                                                 type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the hub's listener
                probe.bind(address)
        except OSError as err:
            in_use = getattr(err, "errno", None) == errno.EADDRINUSE
            raise ComponentConfigError(
                "simulator.env.port" if in_use else "simulator.env.host",
                f"the remote environment hub cannot listen on {config.host}:{config.port} ({err.strerror or err}): "
                + ("another program or run listens there; give this run another simulator.env.port" if in_use
                   else "name an address of this machine (127.0.0.1, the default; 0.0.0.0: every interface)"),
            ) from None

    @classmethod
    def start_services(cls, config: RemoteEnvConfig) -> tuple[RemoteEnvConfig, Any]:
        """Start the run's hub (or find the one listening on ``config.port``), in the pool's
        process; returns the config its environments get (``hub`` named, ``port`` resolved) and
        the hub's actor handle (the hub lives while a handle does).

        Raises:
            RunStopped: the hub cannot listen there. RuntimeError: one already listens there
                for another configuration.
        """
        import ray

        from vla_rl_core.auth import REMOTE_TOKEN_ENV

        token = os.environ.get(REMOTE_TOKEN_ENV) or None
        if config.port == 0:
            name = HUB_NAME.format(port=f"auto_{os.getpid()}_{next(_SERIAL)}")
        else:
            name = HUB_NAME.format(port=config.port)
        options = {"name": name, "get_if_exists": True, "num_cpus": 0, "max_concurrency": 1024}
        hub = ray.remote(RemoteHub).options(**options).remote(config, token)
        try:
            port, served = ray.get(hub.describe.remote())
        except ray.exceptions.RayActorError as err:  # its constructor's error, inside Ray's whole report
            raise RunStopped(f"the remote environment hub could not start on {config.host}:{config.port} "
                             f"({_first_os_error(str(err))}); give this run another simulator.env.port") from None
        if dataclasses.replace(served, hub=None, port=0) != dataclasses.replace(config, hub=None, port=0):
            raise RuntimeError(f"a remote environment hub already listens on port {port} for another configuration "
                               "(simulator.env); give this run another simulator.env.port")
        return dataclasses.replace(config, port=port, hub=name), hub

    # ------------------------------------------------------------------ helpers
    def _submit(self, method: str, *args: Any) -> Any:
        """Call the hub's ``method`` without waiting: its Ray object reference."""
        import ray

        if self._hub is None:
            if self.config.hub is None:
                raise RuntimeError("simulator.env.hub is not set: remote environments run in a SimulatorPool, which "
                                   "starts their hub")
            self._hub = ray.get_actor(self.config.hub)
        return getattr(self._hub, method).remote(*args)

    def _call(self, method: str, *args: Any) -> Any:
        """Call the hub's ``method`` and wait for its answer."""
        import ray

        return ray.get(self._submit(method, *args))

    def _observation(self, obs: Any) -> Any:
        """The client's observation as the simulator contract lays it out (checked)."""
        if not isinstance(obs, dict) or keys.OBS_STATE not in obs:
            raise ValueError(f"remote environment {self._client}: 'obs' must be a dict with 'state', got "
                             f"{type(obs).__name__}")
        try:
            state = np.asarray(obs[keys.OBS_STATE], dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise ValueError(f"remote environment {self._client}: obs['state'] is not an array of numbers ({err})") \
                from None
        if state.shape != (self.config.state_dim,):
            raise ValueError(f"remote environment {self._client}: obs['state'] has shape {state.shape}, this run "
                             f"takes ({self.config.state_dim},)")
        if not np.isfinite(state).all():
            raise ValueError(f"remote environment {self._client}: obs['state'] holds non-finite values (inf or NaN "
                             "in float32)")
        if not self.config.cameras:
            return state
        out = {keys.OBS_STATE: state}
        for key, shape in self.config.image_shapes.items():
            image = np.asarray(obs.get(key))
            if image.shape != tuple(shape) or image.dtype != np.uint8:
                raise ValueError(f"remote environment {self._client}: obs[{key!r}] must be uint8 {tuple(shape)}, "
                                 f"got {image.dtype} {image.shape}")
            out[key] = image
        return out


def _first_os_error(report: str) -> str:
    """The line of Ray's report of a failed actor that names the operating system's error (``OSError:
    [Errno 98] ... address already in use``), else its last line."""
    lines = [line.strip() for line in report.splitlines() if line.strip()]
    return next((line for line in lines if "Errno" in line), lines[-1] if lines else report)
