"""The simulator registry and :func:`make_env`.

A simulator is a ``gymnasium.Env`` subclass registered under a name. Its contract:

- class attribute ``config_class``: the typed config dataclass (with a ``horizon`` field, in
  control steps) that its constructor takes as only argument;
- flat float32 ``Box`` observation and action spaces by default (configs with ``cameras`` turn
  the observation into a ``Dict`` ``{"state": Box, "<camera>_image": uint8 (H, W, 3)}``; the
  simulator workers clip actions to the action space's bounds, except those of a
  ``ChunkedSteps`` environment, which clips on its side),
  ``reset(seed=init_state_id)`` reproducible in any process, ``step`` returning
  ``info["success"]`` (or gymnasium-robotics' ``info["is_success"]``; neither stops the run
  naming the class), no auto-reset;
- its config dataclass has a ``task_name`` property: the task it sets up (``"Lift"``), which
  keys scripted experts (:mod:`simulators.experts`) and names evaluation tasks;
- optionally, ``state_dim`` and ``action_dim`` properties on the config dataclass: the state
  vector's and the action's lengths when they are known before any environment exists (None
  when not); ``vla-rl plan`` estimates the bytes a step moves from them;
- attributes ``horizon`` (int) and ``obs_layout`` (``{key: slice}`` into the observation), and
  ``render_mode`` (``"rgb_array"`` when ``render_frame() -> uint8 (H, W, 3)`` is available,
  else ``None``), and ``instruction`` (the task's language instruction);
- optionally, the :class:`simulators.stepping.UnobservedSteps` mixin, with
  ``step_unobserved(action) -> (reward, terminated, truncated, info)``, a ``step`` that does not
  build the observation, and ``observe()``, the current state's observation as ``step`` would
  return it: the simulator workers then render cameras once per action chunk, for its last
  observation (robosuite and MetaWorld; LIBERO steps as its reference evaluation does);
- optionally, a static ``unavailable_reason() -> str | None`` for simulators from optional extras
  (e.g. LIBERO): why the simulator cannot be created here, or ``None``;
- optionally, a static ``check_config(config)`` raising
  :class:`~vla_rl_core.components.ComponentConfigError` for settings only the simulator library
  can check (robosuite's observation keys and camera names), which :func:`check_env` runs on the
  driver before any worker starts;
- optionally, a class attribute ``task_sets`` (``{name: (task, ...)}``): named task sets a run's
  ``simulator.tasks`` may name (MetaWorld's ``mt10``); a config with a ``task`` field can host
  any list of its tasks;
- optionally, the :class:`simulators.stepping.ChunkedSteps` mixin, with ``send_actions(actions)``
  and ``receive_outcome()`` executing a whole chunk elsewhere (a remote environment: one round trip
  per chunk, all of a worker's environments at once); any
  environment may raise :class:`simulators.stepping.EpisodeLost` from ``step`` / ``step_actions``
  to lose an episode (not scored, counted as lost);
- optionally, a class method ``start_services(config) -> (config, handle)``, which a
  :class:`simulators.pool.SimulatorPool` calls in its own process before starting its actors
  (the remote environments' hub): the environments get the returned config, and the pool keeps
  the handle (a Ray actor lives while a handle does);
- optionally, a ``control_freq`` field or property on the config dataclass: control steps per
  second, Hz (robosuite's ``control_freq``, LIBERO 20, MetaWorld 80): evaluation videos play at it
  and ``vla-rl export-episodes`` stamps it (:func:`control_freq`);
- optionally, a class attribute ``video_camera``: the camera evaluation videos are rendered from
  when the template does not set ``eval.video_camera`` (robosuite ``agentview``, MetaWorld
  ``corner``).

Registering never imports the simulator library itself; environments import it lazily in their
constructor.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from vla_rl_core.components import ComponentConfigError, build_config
from vla_rl_core.registry import Registry

SIMULATORS: Registry[type[gym.Env]] = Registry("simulator", builtins=(
    "simulators.robosuite_env", "simulators.metaworld_env", "simulators.libero_env", "simulators.remote_env"))


def build_env_config(name: str, config: Any = None) -> Any:
    """Turn ``config`` into the config dataclass of simulator ``name``.

    Args:
        name: registered simulator name (e.g. ``"robosuite_lift"``).
        config: ``None`` (all defaults), a mapping of field names to values (e.g. from a YAML
            template), or an instance of the simulator's ``config_class``.

    Returns:
        An instance of ``SIMULATORS.get(name).config_class``.

    Raises:
        RegistryError: if ``name`` is unknown (the message lists the known simulators).
        ComponentConfigError: (a ValueError) the mapping has a key that is not a config field, or
            a value is invalid; the message names the field (``simulator.env.<field>``), as
            :func:`vla_rl_core.components.build_config` does for templates.
        TypeError: if ``config`` is of another type.
    """
    config_class = SIMULATORS.get(name).config_class
    if config is None:
        return config_class()
    if isinstance(config, config_class):
        return config
    if isinstance(config, Mapping):
        built = build_config(config_class, config, "simulator.env")
        check_declared_sizes(built)
        return built
    raise TypeError(
        f"config for simulator {name!r} must be None, a mapping or a {config_class.__name__}, "
        f"got {type(config).__name__}"
    )


SETTINGS_FORMAT = 1
"""The version of :func:`canonical_env`'s form. Stores record it beside the settings (as
``settings_format``), so that a reader can tell a form it does not know from other settings."""


def canonical_env(name: str, config: Any = None) -> dict[str, Any]:
    """The settings of simulator ``name`` as stores record and compare them: every field of its
    config built from ``config`` (:func:`build_env_config`), defaults included, as JSON holds them
    (tuples as lists). Two configs that build the same simulator give the same dict: writing a
    default out changes nothing, and a store that recorded its settings this way keeps the
    defaults of its time, so that a changed default is told apart.

    Raises:
        RegistryError, ValueError, TypeError: as :func:`build_env_config`.
    """
    return json.loads(json.dumps(dataclasses.asdict(build_env_config(name, config))))


def same_env(name: str, config: Any, other_name: str, other_config: Any) -> bool:
    """Whether two simulators with their settings (mappings, as templates and stores hold them, or
    typed configs) are the same: the same name and settings equal as given, or else equal as
    :func:`canonical_env` completes them. A recorded setting that the config class no longer
    accepts, or a simulator this process does not know, makes settings that differ as given
    differ."""
    if name != other_name:
        return False
    if config == other_config:
        return True
    try:
        return canonical_env(name, config) == canonical_env(other_name, other_config)
    except (ValueError, TypeError, KeyError):  # KeyError: RegistryError, an unknown simulator
        return False


def task_name(name: str, config: Any = None) -> str:
    """The task that simulator ``name`` with ``config`` sets up (its config's ``task_name``).

    Raises:
        RegistryError, ValueError, TypeError: as :func:`build_env_config`.
    """
    return build_env_config(name, config).task_name


def control_freq(name: str, config: Any = None) -> float | None:
    """The control frequency of simulator ``name`` with ``config``, Hz (one ``step`` lasts
    ``1 / control_freq`` seconds of simulation): its config's ``control_freq``, or None when the
    simulator states none (a remote environment's).

    Raises:
        RegistryError, ValueError, TypeError: as :func:`build_env_config`.
    """
    value = getattr(build_env_config(name, config), "control_freq", None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def make_env(name: str, config: Any = None) -> gym.Env:
    """Create the simulator registered as ``name``.

    Args:
        name: registered simulator name (e.g. ``"robosuite_lift"``).
        config: see :func:`build_env_config`.

    Returns:
        A new ``gymnasium.Env`` (call ``reset`` before ``step``).

    Raises:
        RegistryError, ValueError, TypeError: as :func:`build_env_config`.
    """
    return SIMULATORS.get(name)(build_env_config(name, config))


DECLARED_SIZES = {"horizon": "horizon", "state_dim": "obs_dim", "action_dim": "action_dim"}
"""Sizes a simulator's config may declare (a field or a property; None: unknown until an
environment is built), each with the :class:`~vla_rl_core.env_spec.EnvSpec` field it states."""


def check_declared_sizes(config: Any, prefix: str = "simulator.env") -> None:
    """The sizes ``config`` declares (:data:`DECLARED_SIZES`) are integers >= 1, so that a
    plug-in simulator's ``horizon: 0`` is refused when the template loads, as robosuite's is.

    Raises:
        ComponentConfigError: naming ``<prefix>.<size>`` and the value.
    """
    for size in DECLARED_SIZES:
        value = getattr(config, size, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ComponentConfigError(f"{prefix}.{size}", f"must be an integer >= 1 (got {value!r})")


def check_spec_against_config(name: str, config: Any, spec: Any) -> None:
    """The spec a simulator's environments state agrees with the sizes its config declares: the
    planner, the policy's sizes and the re-shard estimates read the config, the rollout the spec.

    Raises:
        ComponentConfigError: ``simulator.name``, naming the simulator, the size and both values.
    """
    for size, field in DECLARED_SIZES.items():
        declared, stated = getattr(config, size, None), getattr(spec, field)
        if declared is not None and declared != stated:
            raise ComponentConfigError("simulator.name", f"simulator {name!r}: its config ({type(config).__name__}) "
                                       f"declares {size} {declared}, its environments' spec() gives {field} "
                                       f"{stated}; make them agree")


def check_env(name: str, config: Any = None) -> None:
    """Check simulator ``name``'s settings as far as can be done without its workers: its config
    (:func:`build_env_config`) and, where the class has one, its ``check_config`` (which may import
    the simulator library and build the task once, e.g. robosuite's for observation keys that
    are not the task's defaults).

    Raises:
        RegistryError, ValueError, TypeError: as :func:`build_env_config`.
        ComponentConfigError: from ``check_config``, naming the setting
            (``simulator.env.obs_keys``, ``simulator.env.cameras``).
    """
    config = build_env_config(name, config)
    check = getattr(SIMULATORS.get(name), "check_config", None)
    if check is not None:
        check(config)
