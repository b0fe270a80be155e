"""The scripted-expert registry: simulator name -> expert class.

An expert class is constructed from the environment's ``obs_layout`` (``{key: slice}``) and has
``reset()`` and ``act(obs (obs_dim,)) -> action (act_dim,) float32``.
"""

from __future__ import annotations

from vla_rl.utils.registry import Registry

EXPERTS: Registry[type] = Registry("scripted expert")
