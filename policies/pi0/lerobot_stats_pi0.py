"""The normalisation statistics of a LeRobot π0 checkpoint, read as the entries of openpi's
``norm_stats.json`` (``{"actions": {...}, "state": {...}}``) that
:func:`~policies.pi0.transforms_pi0.load_statistics` fills the policy's buffers from.

LeRobot (0.4 and later) keeps them beside ``model.safetensors``, in the files of its processor
pipelines (huggingface/lerobot, ``src/lerobot/processor/pipeline.py``,
``DataProcessorPipeline._save_pretrained``): ``policy_preprocessor.json`` and
``policy_postprocessor.json`` list their steps as ``{"registry_name", "config", "state_file"}``.
π0's (``src/lerobot/policies/pi0/processor_pi0.py``, ``make_pi0_pre_post_processors``) are a
``normalizer_processor`` step in the first, over the input and output features, and an
``unnormalizer_processor`` step in the second, over the actions. A step's ``state_file`` holds
flat ``"<feature>.<statistic>"`` tensors (``normalize_processor.py``,
``_NormalizationMixin.state_dict``: ``observation.state.mean``, ``action.std``, ...), its
``config`` the features (``{"observation.state": {"type": "STATE", ...}}``) and the ``norm_map``
from feature type to mode (LeRobot's π0: ``{"STATE": "MEAN_STD", "ACTION": "MEAN_STD"}``).

Modes: ``MEAN_STD`` is this policy's ``mean_std`` (LeRobot divides by ``std + 1e-8`` and
un-normalises with ``std``; openpi's ``1e-6``, which this policy uses, moves an action by at most
``1e-6`` of its normalised value); ``QUANTILES`` is ``bounds_q99`` (the same map of q01..q99 onto
[-1, 1], and un-normalised actions are equal; ``bounds_q99`` also clips what it normalises, the
state and the simulator's actions mapped back by ``actions_from_env``, to [-1, 1], which LeRobot
does not); ``IDENTITY`` needs no statistics. ``MIN_MAX`` and ``QUANTILE10`` are not this policy's.
``tests/fixtures/lerobot/pi0_processors`` holds the files LeRobot 0.4.4 itself writes, with its
normalisation of a few values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

from policies.checkpoint_files import read_json_file

PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"

#: LeRobot's ``NormalizationMode`` values → this policy's ``normalization`` (IDENTITY: none).
MODES = {"MEAN_STD": "mean_std", "QUANTILES": "bounds_q99", "IDENTITY": None}

#: LeRobot's feature names of π0's state and actions (``lerobot.utils.constants``), used where a
#: step's config lists no features of that type.
DEFAULT_FEATURES = {"STATE": "observation.state", "ACTION": "action"}


@dataclass(frozen=True)
class LeRobotStatistics:
    """What a LeRobot π0 checkpoint's processor files say about normalisation.

    Attributes:
        entries: ``{"actions": {stat: list[float]}, "state": {...}}``, an entry for each normalised
            feature whose statistics the files hold (``mean``, ``std``, ``q01``, ``q99``, ...).
        modes: ``{"actions": normalization, "state": normalization}``: this policy's
            ``normalization`` of LeRobot's mode for each, ``None`` where LeRobot leaves it as is.
        sources: ``{"actions": Path, "state": Path}``: the pipeline file each came from.
    """

    entries: dict[str, dict[str, list[float]]]
    modes: dict[str, str | None]
    sources: dict[str, Path]


def read_lerobot_statistics(model_path: str | Path) -> LeRobotStatistics | None:
    """The statistics of ``model_path``'s LeRobot processor files, or None without
    ``policy_preprocessor.json``: the state's from the preprocessor's ``normalizer_processor``,
    the actions' from the postprocessor's ``unnormalizer_processor`` (what un-normalises them
    when LeRobot acts), else from the preprocessor's.

    Raises:
        ValueError: a file is not LeRobot's pipeline JSON, its statistics file is missing or not
            safetensors, a mode is not one of :data:`MODES`, or several features of one type
            (the message names the file).
    """
    directory = Path(model_path)
    if not (directory / PREPROCESSOR_FILE).is_file():
        return None
    entries: dict[str, dict[str, list[float]]] = {}
    modes: dict[str, str | None] = {}
    sources: dict[str, Path] = {}
    readings = (("state", "STATE", (PREPROCESSOR_FILE, "normalizer_processor")),
                ("actions", "ACTION", (POSTPROCESSOR_FILE, "unnormalizer_processor"),
                 (PREPROCESSOR_FILE, "normalizer_processor")))
    for entry, feature_type, *candidates in readings:
        for file, registry_name in candidates:
            step = _normalizer_step(directory / file, registry_name)
            if step is None:
                continue
            config, statistics = step
            mode = _mode(directory / file, config, feature_type)
            modes[entry], sources[entry] = mode, directory / file
            feature = _feature(directory / file, config, feature_type)
            values = {name.removeprefix(f"{feature}."): value for name, value in statistics.items()
                      if name.startswith(f"{feature}.") and "." not in name.removeprefix(f"{feature}.")}
            if mode is not None and values:
                entries[entry] = values
            break
    return LeRobotStatistics(entries, modes, sources)


def _normalizer_step(path: Path, registry_name: str) -> tuple[dict, dict[str, list[float]]] | None:
    """The ``config`` and statistics (``{"<feature>.<stat>": values}``, empty without a state
    file) of the first ``registry_name`` step of the pipeline file ``path``; None without either."""
    if not path.is_file():
        return None
    pipeline = read_json_file(path)
    steps = pipeline.get("steps") if isinstance(pipeline, dict) else None
    if not isinstance(steps, list) or not all(isinstance(step, dict) for step in steps):
        raise ValueError(f"{path}: not a LeRobot processor pipeline (a JSON object with a list of \"steps\")")
    step = next((step for step in steps if step.get("registry_name") == registry_name), None)
    if step is None:
        return None
    config = step.get("config") or {}
    if not isinstance(config, dict):
        raise ValueError(f"{path}: the {registry_name} step's config is not a JSON object")
    if "state_file" not in step:
        return config, {}
    state_path = path.parent / str(step["state_file"])
    if not state_path.is_file():
        raise ValueError(f"{path}: its {registry_name} step's statistics, {state_path.name}, are not in {path.parent}")
    try:
        with safe_open(state_path, framework="pt") as tensors:
            statistics = {name: tensors.get_tensor(name).double().flatten().tolist() for name in tensors.keys()}
    except Exception as error:  # noqa: BLE001 - safetensors raises its own types for a bad file
        raise ValueError(f"{state_path}: not a safetensors file of statistics ({type(error).__name__}: {error})") \
            from None
    return config, statistics


def _mode(path: Path, config: dict, feature_type: str) -> str | None:
    """This policy's normalization of the step's mode for ``feature_type`` (IDENTITY where the
    ``norm_map`` has none, as LeRobot reads it)."""
    norm_map = config.get("norm_map") or {}
    mode = norm_map.get(feature_type, "IDENTITY") if isinstance(norm_map, dict) else None
    if mode not in MODES:
        raise ValueError(f"{path}: LeRobot normalises {feature_type} with {mode!r}, which this policy does not "
                         f"implement (it implements {sorted(MODES)}); give policy.config.action_statistics and "
                         "policy.config.proprio_statistics in one of its normalizations")
    return MODES[mode]


def _feature(path: Path, config: dict, feature_type: str) -> str:
    """The name of the step's one feature of ``feature_type`` (:data:`DEFAULT_FEATURES` without one)."""
    features = config.get("features") or {}
    names = [name for name, feature in features.items()
             if isinstance(feature, dict) and feature.get("type") == feature_type] if isinstance(features, dict) else []
    if len(names) > 1:
        raise ValueError(f"{path}: {len(names)} {feature_type} features ({', '.join(names)}); π0 here reads one")
    return names[0] if names else DEFAULT_FEATURES[feature_type]
