"""Simulators: gymnasium adapters over robot simulators, scripted experts and simulator pools.

Importing this package registers the built-in simulators without importing any simulator
library (robosuite, mujoco and LIBERO are imported inside environment constructors).
"""

from simulators.libero_env import LiberoEnv, LiberoEnvConfig
from simulators.registry import SIMULATORS, build_env_config, make_env
from simulators.robosuite_env import RobosuiteEnv, RobosuiteEnvConfig

__all__ = [
    "SIMULATORS",
    "LiberoEnv",
    "LiberoEnvConfig",
    "RobosuiteEnv",
    "RobosuiteEnvConfig",
    "build_env_config",
    "make_env",
]
