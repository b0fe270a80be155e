"""Videos of a live policy's greedy episodes (the held-out evaluations of a training run), and
the camera every evaluation video is rendered from (:func:`video_camera`) and its frame rate
(:func:`video_fps`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_rl.rollout.embodied import rollout_episodes
from vla_rl.utils.video import write_mp4
from vla_rl_core import keys


def record_video(policy, pool, init_state_ids: np.ndarray, path: Path, fps: float, generator: torch.Generator,
                 task_ids: np.ndarray | None = None) -> dict:
    """Roll out greedy episodes with camera frames and write them one after another to ``path`` (mp4).

    Args:
        policy: the policy.
        pool: a simulator pool whose environments render (``render_camera`` set).
        init_state_ids: ``(n,)`` int64, one episode each.
        path: the mp4 file.
        fps: frames per second, Hz.
        generator: the rollout's generator (greedy actions draw nothing from it).
        task_ids: ``(n,)`` int64 tasks of a task-set pool, or None.

    Returns:
        ``{"video_successes": k, "video_episodes": n}``.
    """
    policy.eval()
    n = len(init_state_ids)
    result = rollout_episodes(policy, pool, init_state_ids, task_ids=task_ids, greedy=True, generator=generator,
                              render_indices=tuple(range(n)))
    frames = np.concatenate([result.frames[i] for i in range(n) if i in result.frames])
    write_mp4(path, frames, fps)
    return {"video_successes": int(result.batch[keys.SUCCESS].sum()), "video_episodes": n}


def video_camera(config, simulator: str) -> str:
    """The camera the videos of ``simulator``'s tasks are rendered from: ``eval.video_camera``
    where the template or an override sets it (``vla-rl eval`` copies a run's own), else the
    simulator's (its class's ``video_camera``: robosuite's ``agentview``, MetaWorld's ``corner``),
    else ``eval.video_camera``'s default.

    Args:
        config: the run config.
        simulator: a registered simulator name.
    """
    from simulators.registry import SIMULATORS

    if "video_camera" in config.eval.model_fields_set:
        return config.eval.video_camera
    return getattr(SIMULATORS.get(simulator), "video_camera", config.eval.video_camera)


def video_fps(config, simulator: str, env: Any) -> float:
    """The frame rate of the videos of ``simulator`` with settings ``env``, Hz: ``eval.video_fps``
    where the template or an override sets it, else the simulator's control frequency (one frame a
    control step plays in real time: robosuite's ``control_freq``, MetaWorld 80 Hz, LIBERO 20 Hz;
    :func:`simulators.registry.control_freq`), else ``eval.video_fps``'s default.

    Args:
        config: the run config.
        simulator: a registered simulator name.
        env: the simulator's settings (a mapping, as ``simulator.env`` holds them).

    Raises:
        RegistryError, ValueError, TypeError: as :func:`simulators.registry.build_env_config`.
    """
    from simulators.registry import control_freq

    if "video_fps" in config.eval.model_fields_set:
        return float(config.eval.video_fps)
    freq = control_freq(simulator, env)
    return freq if freq is not None else float(config.eval.video_fps)


def renders_videos(simulator: str) -> bool:
    """Whether ``simulator``'s environments can render videos: its config has a ``render_camera``
    field. A remote environment's has none (its clients send observations, never renders), so the
    evaluations of a ``simulator.name: remote`` run record no videos whatever ``eval.video_episodes``
    says.

    Args:
        simulator: a registered simulator name.
    """
    from simulators.registry import SIMULATORS

    return "render_camera" in {field.name for field in dataclasses.fields(SIMULATORS.get(simulator).config_class)}


def no_videos_note(config) -> str | None:
    """Why an embodied run whose ``eval.video_episodes`` asks for videos records none (its
    simulator cannot render, :func:`renders_videos`), as one line for the driver's console; None
    when it records them, asks for none, or is not embodied.

    Args:
        config: the run config.
    """
    if (config.run.workflow != "embodied" or config.eval.video_episodes == 0 or config.eval.num_episodes == 0
            or renders_videos(config.simulator.name)):
        return None
    return (f"no evaluation videos (eval.video_episodes={config.eval.video_episodes}): the "
            f"{config.simulator.name} simulator's config has no render_camera field (docs/extending.md)")
