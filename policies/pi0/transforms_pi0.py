"""openpi's data transforms that π0's checkpoints were trained with, mirrored for the RL policy:
state-relative ("delta") actions; the policy's statistics buffers and the ``norm_stats.json``
that fills them (and that :func:`norm_stats_of` writes back). The normalisation formulas are
:mod:`policies.normalization`'s (:class:`~policies.normalization.MeanStdStatistics`,
:class:`~policies.normalization.ActionStatistics`).

Sources (Physical-Intelligence/openpi, read at ``15a9616``):

- the mean/std (z-score) form is π0's (``src/openpi/training/config.py`` 187:
  ``use_quantile_norm = model_type != PI0``), quantiles are for π0-FAST and π0.5;
- ``DeltaActions`` / ``AbsoluteActions`` (204–244): ``actions[..., :dims] -= where(mask,
  state[..., :dims], 0)`` on every position of the chunk (and ``+=`` back), ``dims`` the mask's
  length; ``make_bool_mask(6, -1)`` (``config.py`` 339, ``pi0_libero``'s
  ``extra_delta_transform``) is six True then one False;
- the order (``src/openpi/policies/policy_config.py`` 77–88): inputs ``DeltaActions`` (a data
  transform) before ``Normalize``, so the state it subtracts is the raw one; outputs
  ``Unnormalize`` before ``AbsoluteActions``, which adds the state that ``Unnormalize`` restored
  from the normalised input (the raw state up to float rounding; here the raw state itself).
"""

from __future__ import annotations

from pathlib import Path

import torch
from tensordict import TensorDict
from torch import Tensor, nn

from policies.checkpoint_files import read_json_file
from policies.normalization import ActionStatistics, MeanStdStatistics, fit_bounds_q99, fit_mean_std
from policies.pi0.checkpoint_pi0 import ARCHITECTURE_FILE
from policies.pi0.configuration_pi0 import NORMALIZATION_FIELDS, PI0PolicyConfig
from policies.pi0.lerobot_stats_pi0 import PREPROCESSOR_FILE, LeRobotStatistics, read_lerobot_statistics
from vla_rl_core import keys

#: openpi's normalisation statistics file in a checkpoint's assets (``{"norm_stats": {"actions":
#: {"mean", "std", "q01", "q99"}, "state": {...}}}``).
NORM_STATS_FILE = "norm_stats.json"
def delta_offset(state: Tensor, mask: tuple[bool, ...], action_dim: int) -> Tensor:
    """What openpi's ``DeltaActions`` subtracts from (and ``AbsoluteActions`` adds to) every action
    of a chunk: ``where(mask, state[..., :dims], 0)``, zero-padded to ``action_dim`` values.

    Args:
        state: ``(batch, >= len(mask))`` raw state.
        mask: the delta mask (``dims = len(mask) <= action_dim``).
        action_dim: values per action.

    Returns:
        float32 ``(batch, 1, action_dim)``, broadcasting over the chunk positions.
    """
    dims = len(mask)
    flags = torch.tensor(mask, dtype=torch.bool, device=state.device)
    offset = torch.zeros(state.shape[0], action_dim, device=state.device)
    offset[:, :dims] = torch.where(flags, state[:, :dims].float(), torch.zeros((), device=state.device))
    return offset[:, None]  # (B, 1, action_dim)


def norm_stats_file(model_path: str) -> Path | None:
    """openpi's ``norm_stats.json`` of a checkpoint directory, or None without one:
    ``<model_path>/norm_stats.json``, else the only one under ``<model_path>/assets/`` (openpi's
    ``convert_jax_model_to_pytorch.py`` copies the checkpoint's ``assets/<asset_id>/norm_stats.json``,
    e.g. ``assets/physical-intelligence/libero/``).

    Raises:
        ValueError: ``assets/`` holds several.
    """
    path = Path(model_path) / NORM_STATS_FILE
    if path.is_file():
        return path
    found = sorted((Path(model_path) / "assets").glob(f"**/{NORM_STATS_FILE}"))
    if len(found) > 1:
        raise ValueError(f"{model_path}/assets holds several {NORM_STATS_FILE} ({[str(f) for f in found]}); copy the "
                         f"checkpoint's own to {path}")
    return found[0] if found else None


def read_norm_stats(path: Path) -> dict:
    """The statistics of an openpi ``norm_stats.json`` (:func:`norm_stats_file`): ``{"actions":
    ..., "state": ...}``.

    Raises:
        ValueError: the file is not a JSON object of statistics (the message names it).
    """
    raw = read_json_file(path)
    stats = raw.get("norm_stats", raw) if isinstance(raw, dict) else None
    if not isinstance(stats, dict):
        raise ValueError(f"{path} must hold a JSON object {{'norm_stats': {{'actions': ..., 'state': ...}}}}")  # noqa: TRY004
    return stats


def truncate_norm_stats(stats: dict, fields: tuple[str, ...], length: int, name: str,
                        optional: tuple[str, ...] = (), source: str | Path = NORM_STATS_FILE) -> dict:
    """The first ``length`` values of ``fields`` of a ``norm_stats.json`` entry (openpi writes them
    unpadded; its ``Normalize`` also cuts them to the data's width), and of the ``optional`` fields
    the entry has (bounds_q99's action ``mask``, which :func:`norm_stats_of` writes).

    Raises:
        ValueError: a field is missing or shorter than ``length`` (the message names ``source``,
            the file, and the entry ``name``).
    """
    present = fields + tuple(key for key in optional if key in stats)
    if any(len(stats.get(key, ())) < length for key in present):
        raise ValueError(f"{source}: {name} statistics need {' and '.join(present)} of at least {length} "
                         f"values, got fields {sorted(stats)}")
    return {key: list(stats[key][:length]) for key in present}


def norm_stats_of(module: nn.Module, normalization: str) -> dict:
    """``module``'s set statistics as the entries of openpi's ``norm_stats.json`` (``{"actions":
    ..., "state": ...}``, an entry only where set): the fields ``normalization`` reads (``mean``,
    ``std`` or ``q01``, ``q99``) and, for bounds_q99's actions, the ``mask`` (not an openpi field;
    :func:`load_statistics` reads it back). float32 values written as JSON numbers read back
    exactly."""
    entries = {}
    for prefix, entry in (("action", "actions"), ("proprio", "state")):
        if not bool(getattr(module, f"{prefix}_statistics_set")):
            continue
        values = {field: getattr(module, f"{prefix}_{field}").float().tolist()
                  for field in NORMALIZATION_FIELDS[normalization]}
        if normalization == "bounds_q99" and prefix == "action":
            values["mask"] = module.action_mask.tolist()
        entries[entry] = values
    return entries


def raw_state(obs: TensorDict | None, dims: int, batch: int, method: str) -> Tensor:
    """The first ``dims`` raw ``state`` values of the observations that state-relative actions
    refer to (openpi's ``DeltaActions`` runs before ``Normalize``).

    Args:
        obs: simulator observations, batch ``batch``.
        dims: the delta mask's length.
        batch: rows of the actions.
        method: the policy method asking (for the error message).

    Returns:
        float32 ``(batch, dims)``.

    Raises:
        ValueError: ``obs`` is None, or has no ``state`` of that shape.
    """
    if obs is None:
        raise ValueError(f"PI0Policy.{method} needs the observations of the actions (obs): delta_action_mask makes "
                         f"the first {dims} action values relative to the state")
    state = obs[keys.OBS_STATE] if isinstance(obs, TensorDict) and keys.OBS_STATE in obs.keys() else None  # noqa: SIM118
    if state is None or state.ndim != 2 or state.shape[0] != batch or state.shape[1] < dims:
        shape = None if state is None else tuple(state.shape)
        raise ValueError(f"PI0Policy.{method}: obs must be a TensorDict with {keys.OBS_STATE!r} of shape ({batch}, "
                         f">= {dims}) (the actions' observations), got {shape}")
    return state[:, :dims].float()


# --------------------------------------------------------------------------------- statistics buffers
# A policy keeps the statistics of its ``normalization`` as buffers (training checkpoints keep them;
# every buffer stays finite): ``<prefix>_q01``, ``<prefix>_q99`` (and ``action_mask``) for bounds_q99,
# ``<prefix>_mean``, ``<prefix>_std`` for mean_std, and ``<prefix>_statistics_set``, for the prefixes
# ``action`` and ``proprio``.


def register_statistics(module: nn.Module, normalization: str, action_dim: int, proprio_dim: int) -> None:
    """Register the unset statistics buffers of ``normalization`` on ``module`` (zeros; stds 1)."""
    for field in NORMALIZATION_FIELDS[normalization]:
        module.register_buffer(f"action_{field}", torch.full((action_dim,), float(field == "std")))
        module.register_buffer(f"proprio_{field}", torch.full((proprio_dim,), float(field == "std")))
    if normalization == "bounds_q99":
        module.register_buffer("action_mask", torch.ones(action_dim, dtype=torch.bool))
    module.register_buffer("action_statistics_set", torch.tensor(False))
    module.register_buffer("proprio_statistics_set", torch.tensor(False))


def buffered_statistics(module: nn.Module, prefix: str, normalization: str) -> ActionStatistics | MeanStdStatistics | None:
    """The ``prefix`` statistics of ``module``'s buffers, or None while unset (the proprio's
    bounds_q99 normalise every feature)."""
    if not bool(getattr(module, f"{prefix}_statistics_set")):
        return None
    if normalization == "mean_std":
        return MeanStdStatistics(getattr(module, f"{prefix}_mean"), getattr(module, f"{prefix}_std"))
    q01, q99 = getattr(module, f"{prefix}_q01"), getattr(module, f"{prefix}_q99")
    mask = module.action_mask if prefix == "action" else torch.ones_like(q01, dtype=torch.bool)
    return ActionStatistics(q01, q99, mask)


def fit_statistics(module: nn.Module, prefix: str, values: Tensor, normalization: str) -> None:
    """Set ``module``'s ``prefix`` statistics from ``values`` ``(batch, dim)``: the 1st and 99th
    percentiles (bounds_q99, as OpenVLA-OFT) or the mean and population standard deviation
    (mean_std, as openpi's ``RunningStats``)."""
    if normalization == "mean_std":
        fitted = dict(zip(("mean", "std"), fit_mean_std(values)))
    else:
        fitted = dict(zip(("q01", "q99"), fit_bounds_q99(values)))
    for name, value in fitted.items():
        getattr(module, f"{prefix}_{name}").copy_(value)
    getattr(module, f"{prefix}_statistics_set").fill_(True)


def load_statistics(module: nn.Module, config: PI0PolicyConfig) -> None:
    """Fill ``module``'s buffers with the config's statistics, else the checkpoint's: its
    ``norm_stats.json``, else LeRobot's processor files (:mod:`policies.pi0.lerobot_stats_pi0`);
    the first ``action_dim`` / ``proprio_dim`` values of the fields of their ``actions`` /
    ``state`` entries that ``config.normalization`` reads, and bounds_q99's action ``mask`` when
    the entry has one.

    Raises:
        ValueError: a ``model_path`` of openpi's or LeRobot's (no ``pi0_architecture.json``: not
            :meth:`PI0Policy.save_pretrained`'s) without a ``norm_stats.json`` or LeRobot's
            statistics of its normalised actions, and no ``action_statistics``: its actions would
            reach the simulator normalised (openpi's ``create_trained_policy`` refuses it too);
            malformed statistics (those of the checkpoint: the message names its file); openpi's
            statistics (``mean`` and ``std`` with the quantiles) read with ``normalization:
            bounds_q99``, which would normalise otherwise than openpi trained π0; LeRobot's
            statistics of another normalisation than ``config.normalization``.
    """
    fields = NORMALIZATION_FIELDS[config.normalization]
    path = norm_stats_file(config.model_path) if config.model_path is not None else None
    lerobot = read_lerobot_statistics(config.model_path) if path is None and config.model_path is not None else None
    if lerobot is not None:
        check_lerobot_normalization(lerobot, config)
    actions_normalised_without_statistics = lerobot is None or (
        lerobot.modes.get("actions") is not None and "actions" not in lerobot.entries)
    if (path is None and actions_normalised_without_statistics and config.model_path is not None
            and config.action_statistics is None and not (Path(config.model_path) / ARCHITECTURE_FILE).is_file()):
        lerobot_files = (f" (its {PREPROCESSOR_FILE} holds no statistics of the actions)" if lerobot is not None
                         else f", nor LeRobot's {PREPROCESSOR_FILE}")
        raise ValueError(f"{config.model_path}: no {NORM_STATS_FILE} there nor under its assets/ (openpi keeps it in "
                         f"assets/<asset_id>/){lerobot_files}: openpi's and LeRobot's π0 act on normalised actions, "
                         f"and without their statistics the simulator would get them as they are; copy the "
                         f"checkpoint's {NORM_STATS_FILE} there, or give policy.config.action_statistics")
    checkpoint = read_norm_stats(path) if path is not None else lerobot.entries if lerobot is not None else {}
    for prefix, stats, length, entry in (("action", config.action_statistics, config.action_dim, "actions"),
                                         ("proprio", config.proprio_statistics, config.proprio_dim, "state")):
        what = f"{prefix} statistics"
        if stats is None and length and entry in checkpoint:
            source = path if path is not None else lerobot.sources[entry]
            if path is not None and config.normalization == "bounds_q99" and {"mean", "std"} <= set(checkpoint[entry]):
                # openpi's file (its NormStats: mean, std, q01, q99); this policy's bounds_q99
                # export writes q01 and q99 alone
                raise ValueError(f"{path}: its {entry} statistics hold mean and std, as openpi's norm_stats.json does, "
                                 "and openpi trains π0 with mean/std normalisation (use_quantile_norm = model_type "
                                 "!= PI0); set policy.config.normalization=mean_std (or give "
                                 f"policy.config.{prefix}_statistics to normalise with quantiles)")
            mask = ("mask",) if config.normalization == "bounds_q99" and prefix == "action" else ()
            stats = truncate_norm_stats(checkpoint[entry], fields, length, entry, optional=mask, source=source)
            what = f"{source}: {entry} statistics"
        if stats is None:
            continue
        if config.normalization == "mean_std":
            parsed = MeanStdStatistics.from_dict(stats, what)
            values = {"mean": parsed.mean, "std": parsed.std}
        else:
            parsed = ActionStatistics.from_dict(stats, what)
            values = {"q01": parsed.q01, "q99": parsed.q99, **({"mask": parsed.mask} if prefix == "action" else {})}
        for name, value in values.items():
            getattr(module, f"{prefix}_{name}").copy_(value)
        getattr(module, f"{prefix}_statistics_set").fill_(True)


def check_lerobot_normalization(lerobot: LeRobotStatistics, config: PI0PolicyConfig) -> None:
    """LeRobot's modes of the state and actions whose statistics this policy would read from its
    files (those the config does not give) must be ``config.normalization``.

    Raises:
        ValueError: another mode (the message names the file and the setting to change), or the
            state and the actions in two modes (this policy normalises both alike).
    """
    used = {entry: lerobot.modes[entry] for entry, given, length in
            (("actions", config.action_statistics, config.action_dim),
             ("state", config.proprio_statistics, config.proprio_dim))
            if given is None and length and entry in lerobot.entries}
    if len(set(used.values())) > 1:
        raise ValueError(f"{lerobot.sources['state']}: LeRobot normalises the state with {used['state']} and the "
                         f"actions with {used['actions']}, and this policy normalises both alike; give "
                         "policy.config.proprio_statistics and policy.config.action_statistics")
    for entry, mode in used.items():
        if mode != config.normalization:
            raise ValueError(f"{lerobot.sources[entry]}: LeRobot normalises the {entry} with what this policy calls "
                             f"{mode}, not {config.normalization}; set policy.config.normalization={mode}")
