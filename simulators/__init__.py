"""Simulators: gymnasium adapters over robot simulators, scripted experts and simulator pools.

Importing this package registers the built-in simulators without importing any simulator
library (robosuite, mujoco, MetaWorld and LIBERO are imported inside environment constructors).
"""

from simulators.libero_env import LiberoEnv, LiberoEnvConfig
from simulators.metaworld_env import MetaWorldEnv, MetaWorldEnvConfig
from simulators.registry import SIMULATORS, build_env_config, make_env
from simulators.remote_config import RemoteEnvConfig
from simulators.remote_env import RemoteEnv
from simulators.robosuite_env import RobosuiteEnv, RobosuiteEnvConfig

__all__ = [
    "SIMULATORS",
    "LiberoEnv",
    "LiberoEnvConfig",
    "MetaWorldEnv",
    "MetaWorldEnvConfig",
    "RemoteEnv",
    "RemoteEnvConfig",
    "RobosuiteEnv",
    "RobosuiteEnvConfig",
    "build_env_config",
    "make_env",
]
