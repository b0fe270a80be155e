"""Behaviour-cloning demonstrations from a LeRobot dataset (``warm_start.dataset``).

``warm_start.dataset_keys`` maps the dataset's features onto what the policy reads: ``state``,
``<camera>_image`` (a video feature, ``(H, W, 3)``) and ``actions`` (default:
``observation.state`` → ``state``, ``action`` → ``actions``). The first ``warm_start.num_demos``
episodes are cloned, every frame with the demonstrated next actions (chunks as for scripted
demonstrations); a camera policy reads each episode's task string as its instruction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from vla_rl.data.lerobot_format import LeRobotFormatError
from vla_rl.data.lerobot_reader import LeRobotReader
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

ACTIONS_ROLE = "actions"


def check_dataset(root: str | Path, dataset_keys: Mapping[str, str], num_demos: int,
                  sizes: Mapping[str, int] | None = None, images: Sequence[str] = ()) -> str | None:
    """The planner's check of ``warm_start.dataset``: what is wrong with it, in one phrase, or None.

    Checks that ``root`` is a LeRobot v3 dataset with at least ``num_demos`` episodes, that every
    feature ``dataset_keys`` names exists with a fitting dtype (a numeric dtype for ``state`` and
    ``actions``, a video for ``<camera>_image``), that ``state``, ``actions`` and each of
    ``images`` (the ``<camera>_image`` inputs the simulator's config renders, which
    :func:`dataset_episodes` needs) are mapped once each, and that the sizes are those in
    ``sizes`` (``state`` / ``actions`` → values; the sizes the simulator's config declares before
    any environment exists; a role left out is checked when the demonstrations are read).
    """
    roles = list(dataset_keys.values())
    for role in (keys.OBS_STATE, ACTIONS_ROLE):
        if roles.count(role) != 1:
            return f"warm_start.dataset_keys must map exactly one feature to {role!r}, got {dict(dataset_keys)}"
    missing = sorted(set(images) - set(roles))
    if missing:
        return _unmapped_images(missing)
    for role in roles:
        if role not in (keys.OBS_STATE, ACTIONS_ROLE) and not role.endswith(keys.OBS_IMAGE_SUFFIX):
            return (f"warm_start.dataset_keys: {role!r} is not a policy input ('state', 'actions' or "
                    f"'<camera>{keys.OBS_IMAGE_SUFFIX}')")
    try:
        reader = LeRobotReader(root)
    except LeRobotFormatError as err:
        return str(err)
    if reader.num_episodes < num_demos:
        return f"{root} holds {reader.num_episodes} episodes, fewer than warm_start.num_demos={num_demos}"
    for feature, role in dataset_keys.items():
        spec = reader.features.get(feature)
        if spec is None:
            return (f"{root} has no feature {feature!r} (warm_start.dataset_keys maps it to {role!r}); its features: "
                    f"{sorted(reader.features)}")
        image = role.endswith(keys.OBS_IMAGE_SUFFIX)
        if image != (spec["dtype"] == "video") or (not image and (len(spec["shape"]) != 1 or not _numeric(spec))):
            return (f"{root}: feature {feature!r} is {spec['dtype']} {spec['shape']}, which cannot be the policy's "
                    f"{role!r} ({'an (H, W, 3) video' if image else 'a vector of numbers'})")
        if not image and sizes and sizes.get(role) and list(spec["shape"]) != [sizes[role]]:
            return (f"{root}: feature {feature!r} has shape {spec['shape']}, the simulator's {role!r} has "
                    f"{sizes[role]} values")
    return None


def dataset_episodes(root: str | Path, dataset_keys: Mapping[str, str], num_demos: int,
                     spec: EnvSpec) -> list[dict[str, np.ndarray]]:
    """The first ``num_demos`` episodes, laid out as a demonstration store's episodes
    (:func:`vla_rl.trainers.warm_start.demo_fields`): ``obs`` float32 ``(T, obs_dim)`` for a
    state-only simulator, else ``state``, each ``<camera>_image`` uint8 ``(T, H, W, 3)`` and the
    encoded ``instruction`` (each frame's task); and ``actions`` float32 ``(T, action_dim)``.

    Args:
        root: the dataset root.
        dataset_keys: feature → policy input (module docstring).
        num_demos: episodes to read.
        spec: the simulator's spec (``obs_dim``, ``action_dim``, ``images``): the dataset must fit it.

    Raises:
        ValueError: the dataset's state, action or image sizes are not the simulator's, a camera
            the policy reads is not mapped, or a state or action is NaN or infinite (naming
            ``warm_start.dataset``);
            :class:`LeRobotFormatError` (a ``ValueError``): the dataset cannot be read.
    """
    from vla_rl_core.observations import encode_instruction

    reader = LeRobotReader(root)
    by_role = {role: feature for feature, role in dataset_keys.items()}
    images = dict(spec.images or {})
    missing = sorted(set(images) - set(by_role))
    if missing:
        raise ValueError(f"warm_start.dataset: {_unmapped_images(missing)}")
    sizes = {keys.OBS_STATE: [spec.obs_dim], ACTIONS_ROLE: [spec.action_dim],
             **{key: list(shape) for key, shape in images.items()}}
    for role, feature in by_role.items():
        if role in sizes and list(reader.features[feature]["shape"]) != sizes[role]:
            raise ValueError(f"warm_start.dataset: feature {feature!r} has shape {reader.features[feature]['shape']}, "
                             f"the simulator's {role!r} has {sizes[role]} ({root})")
    episodes = []
    for index in range(num_demos):
        frames = reader.episode(index, [by_role[keys.OBS_STATE], by_role[ACTIONS_ROLE], *(by_role[k] for k in images)])
        state = _finite(frames[by_role[keys.OBS_STATE]].astype(np.float32), root, by_role[keys.OBS_STATE], index)
        episode = {ACTIONS_ROLE: _finite(frames[by_role[ACTIONS_ROLE]].astype(np.float32), root, by_role[ACTIONS_ROLE],
                                         index)}
        if not images:
            episode[keys.OBS] = state
        else:
            episode[keys.OBS_STATE] = state
            episode |= {key: frames[by_role[key]] for key in images}
            episode[keys.OBS_INSTRUCTION] = np.repeat(encode_instruction(str(frames["task"]))[None], len(state), axis=0)
        episodes.append(episode)
    return episodes


def _numeric(spec: Mapping[str, object]) -> bool:
    """Whether a feature of ``info.json`` declares numbers (LeRobot's dtypes are numpy's names)."""
    try:
        return np.dtype(str(spec["dtype"])).kind in "biuf"
    except TypeError:
        return False


def _finite(values: np.ndarray, root: str | Path, feature: str, episode: int) -> np.ndarray:
    """``values`` ``(T, dim)``, if every one is finite.

    Raises:
        ValueError: a NaN or infinity, naming the dataset, feature, episode and first frame.
    """
    bad = np.flatnonzero(~np.isfinite(values).all(axis=tuple(range(1, values.ndim))))
    if len(bad):
        raise ValueError(f"warm_start.dataset: {root}: feature {feature!r} of episode {episode} holds "
                         f"{values[bad[0]].tolist()} at frame {int(bad[0])} ({len(bad)} frames with NaN or "
                         "infinite values), which behaviour cloning cannot learn from")
    return values


def _unmapped_images(missing: list[str]) -> str:
    return (f"the policy reads camera images {missing}; map dataset features to them in warm_start.dataset_keys "
            "(e.g. observation.images.agentview: agentview_image)")


def dataset_states(root: str | Path, dataset_keys: Mapping[str, str], num_demos: int) -> np.ndarray:
    """The state of every frame of the first ``num_demos`` episodes, float32 ``(N, obs_dim)``
    (the critic's normalisation statistics)."""
    reader = LeRobotReader(root)
    feature = next(f for f, role in dataset_keys.items() if role == keys.OBS_STATE)
    return np.concatenate([_finite(reader.episode(i, [feature])[feature].astype(np.float32), root, feature, i)
                           for i in range(num_demos)])
