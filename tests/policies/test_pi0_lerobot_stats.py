"""LeRobot's π0 checkpoints keep their normalisation statistics in the files of LeRobot's processor
pipelines (policy_preprocessor.json / policy_postprocessor.json and a safetensors file per
(un)normalizer step); the policy reads them where the checkpoint has no norm_stats.json. The files
are written here as LeRobot's DataProcessorPipeline._save_pretrained writes them (huggingface/lerobot
src/lerobot/processor/pipeline.py; π0's steps: src/lerobot/policies/pi0/processor_pi0.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from policies.pi0 import PI0PolicyConfig
from policies.pi0.transforms_pi0 import load_statistics, register_statistics

STATE = {"mean": [0.5, -1.0, 2.0, 0.0, 9.0], "std": [2.0, 0.5, 0.25, 1.0, 9.0], "min": [-3.0] * 5,
         "max": [3.0] * 5, "q01": [-2.0, -1.5, -1.0, -0.5, 9.0], "q99": [2.0, 1.5, 1.0, 0.5, 9.0], "count": [40.0]}
ACTION = {"mean": [0.1, 0.2, 0.3, 9.0], "std": [1.0, 2.0, 3.0, 9.0], "min": [-1.0] * 4, "max": [1.0] * 4,
          "q01": [-0.5, -0.25, -0.125, 9.0], "q99": [0.5, 0.25, 0.125, 9.0], "count": [40.0]}
FEATURES = {"observation.images.base_0_rgb": {"type": "VISUAL", "shape": [3, 224, 224]},
            "observation.state": {"type": "STATE", "shape": [5]}, "action": {"type": "ACTION", "shape": [4]}}


def flat(stats: dict[str, dict[str, list[float]]]) -> dict[str, torch.Tensor]:
    """``_NormalizationMixin.state_dict``: ``"<feature>.<stat>"`` float32 tensors."""
    return {f"{feature}.{name}": torch.tensor(values, dtype=torch.float32)
            for feature, entry in stats.items() for name, values in entry.items()}


def write_lerobot_processors(directory: Path, norm_map: dict[str, str], action=ACTION,
                             postprocessor_action=None, with_statistics: bool = True) -> Path:
    """π0's two pipelines as LeRobot saves them: the normalizer over every feature (and the
    dataset's statistics of every feature, images' included), the unnormalizer over the actions."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps({"type": "pi0", "chunk_size": 4}))
    config = {"eps": 1e-8, "features": FEATURES, "norm_map": {"VISUAL": "IDENTITY", **norm_map}}
    stats = {"observation.images.base_0_rgb": {"mean": [[[0.5]], [[0.5]], [[0.5]]]}, "observation.state": STATE,
             "action": action}
    pre_steps = [{"registry_name": "rename_observations_processor", "config": {"rename_map": {}}},
                 {"registry_name": "to_batch_processor", "config": {}},
                 {"registry_name": "pi0_new_line_processor", "config": {}},
                 {"registry_name": "tokenizer_processor", "config": {"max_length": 48}},
                 {"registry_name": "device_processor", "config": {"device": "cuda"}},
                 {"registry_name": "normalizer_processor", "config": config}]
    post_config = {**config, "features": {"action": FEATURES["action"]}}
    post_steps = [{"registry_name": "unnormalizer_processor", "config": post_config},  # LeRobot 0.4.4's order
                  {"registry_name": "device_processor", "config": {"device": "cpu"}}]
    if with_statistics:
        save_file(flat(stats), directory / "policy_preprocessor_step_5_normalizer_processor.safetensors")
        pre_steps[5]["state_file"] = "policy_preprocessor_step_5_normalizer_processor.safetensors"
        post_stats = {**stats, "action": postprocessor_action or action}
        save_file(flat(post_stats), directory / "policy_postprocessor_step_0_unnormalizer_processor.safetensors")
        post_steps[0]["state_file"] = "policy_postprocessor_step_0_unnormalizer_processor.safetensors"
    (directory / "policy_preprocessor.json").write_text(json.dumps({"name": "policy_preprocessor", "steps": pre_steps}))
    (directory / "policy_postprocessor.json").write_text(json.dumps({"name": "policy_postprocessor",
                                                                     "steps": post_steps}))
    return directory


def statistics(directory: Path, **fields) -> torch.nn.Module:
    module = torch.nn.Module()
    config = PI0PolicyConfig(model_path=str(directory), action_dim=3, proprio_dim=4, **fields)
    register_statistics(module, config.normalization, config.action_dim, config.proprio_dim)
    load_statistics(module, config)
    return module


def test_a_lerobot_checkpoint_s_mean_std_statistics_are_read_from_its_processor_files(tmp_path):
    """Before, such a checkpoint was refused for want of a norm_stats.json. The actions'
    statistics are the unnormalizer's (what un-normalises LeRobot's actions), the state's the
    normalizer's, cut to action_dim / proprio_dim."""
    unnormalizer_action = {**ACTION, "mean": [-0.1, -0.2, -0.3, 9.0]}
    directory = write_lerobot_processors(tmp_path / "lerobot", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
                                         postprocessor_action=unnormalizer_action)
    module = statistics(directory, normalization="mean_std")
    assert module.action_mean.tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert module.action_std.tolist() == [1.0, 2.0, 3.0]
    assert module.proprio_mean.tolist() == [0.5, -1.0, 2.0, 0.0]
    assert module.proprio_std.tolist() == [2.0, 0.5, 0.25, 1.0]
    assert bool(module.action_statistics_set) and bool(module.proprio_statistics_set)
    # the config's own statistics win over the files'
    given = statistics(directory, normalization="mean_std", action_statistics={"mean": [0.0] * 3, "std": [5.0] * 3})
    assert given.action_std.tolist() == [5.0] * 3 and given.proprio_std.tolist() == [2.0, 0.5, 0.25, 1.0]


LEROBOT_FILES = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "pi0_processors"


@pytest.mark.parametrize(("mode", "normalization"), [("mean_std", "mean_std"), ("quantiles", "bounds_q99")])
def test_the_files_lerobot_itself_writes_read_as_lerobot_normalises(mode, normalization):
    """tests/fixtures/lerobot/pi0_processors: LeRobot 0.4.4's own make_pi0_pre_post_processors and
    save_pretrained (tests/fixtures/lerobot/make_pi0_processors.py; every feature's statistics,
    images' (3, 1, 1), count, q10..q90). The buffers hold the dataset statistics given, and the
    policy un-normalises actions as LeRobot's reloaded postprocessor did (lerobot_roundtrip.json;
    mean_std: openpi's std + 1e-6 against LeRobot's std, at most 1e-6 of the value apart)."""
    import json

    from policies.normalization import ActionStatistics, MeanStdStatistics

    directory = LEROBOT_FILES / mode
    given = json.loads((directory / "stats.json").read_text())
    lerobot = json.loads((directory / "lerobot_roundtrip.json").read_text())
    module = torch.nn.Module()
    config = PI0PolicyConfig(model_path=str(directory), action_dim=7, proprio_dim=8, normalization=normalization)
    register_statistics(module, normalization, 7, 8)
    load_statistics(module, config)
    fields = ("mean", "std") if mode == "mean_std" else ("q01", "q99")
    for prefix, feature in (("action", "action"), ("proprio", "observation.state")):
        for name in fields:
            expected = torch.tensor(given[feature][name], dtype=torch.float32)
            torch.testing.assert_close(getattr(module, f"{prefix}_{name}"), expected, rtol=0, atol=0)
    if mode == "mean_std":
        actions = MeanStdStatistics(module.action_mean, module.action_std)
        state = MeanStdStatistics(module.proprio_mean, module.proprio_std)
    else:
        actions = ActionStatistics(module.action_q01, module.action_q99, module.action_mask)
        state = ActionStatistics(module.proprio_q01, module.proprio_q99, torch.ones(8, dtype=torch.bool))
    normalised = torch.tensor(lerobot["normalised_actions"])
    theirs = torch.tensor(lerobot["postprocessor_unnormalised_actions"])
    torch.testing.assert_close(actions.denormalize(normalised), theirs, rtol=2e-6, atol=1e-6)
    raw_state = torch.tensor(lerobot["raw_state"])
    their_state = torch.tensor(lerobot["normalizer_normalised_state"])
    if mode == "quantiles":  # bounds_q99 clips the normalised values, LeRobot's QUANTILES does not
        their_state = their_state.clamp(-1, 1)
    torch.testing.assert_close(state.normalize(raw_state), their_state, rtol=2e-5, atol=2e-5)


def test_quantiles_are_bounds_q99_and_another_normalization_is_named(tmp_path):
    quantiles = write_lerobot_processors(tmp_path / "q", {"STATE": "QUANTILES", "ACTION": "QUANTILES"})
    module = statistics(quantiles)  # bounds_q99, the default
    assert module.action_q01.tolist() == [-0.5, -0.25, -0.125] and module.action_mask.tolist() == [True] * 3
    assert module.proprio_q99.tolist() == [2.0, 1.5, 1.0, 0.5]
    mean_std = write_lerobot_processors(tmp_path / "m", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    with pytest.raises(ValueError, match=rf"^{mean_std}/policy_postprocessor.json: LeRobot normalises the actions "
                                         r"with what this policy calls mean_std, not bounds_q99; set "
                                         r"policy.config.normalization=mean_std$"):
        statistics(mean_std)
    mixed = write_lerobot_processors(tmp_path / "x", {"STATE": "MEAN_STD", "ACTION": "QUANTILES"})
    with pytest.raises(ValueError, match=r"normalises the state with mean_std and the actions with bounds_q99, and "
                                         r"this policy normalises both alike"):
        statistics(mixed)
    min_max = write_lerobot_processors(tmp_path / "mm", {"STATE": "MEAN_STD", "ACTION": "MIN_MAX"})
    with pytest.raises(ValueError, match=rf"^{min_max}/policy_postprocessor.json: LeRobot normalises ACTION with "
                                         r"'MIN_MAX', which this policy does not implement"):
        statistics(min_max, normalization="mean_std")


def test_actions_left_as_they_are_need_no_statistics_and_files_without_statistics_are_refused(tmp_path):
    identity = write_lerobot_processors(tmp_path / "i", {"STATE": "MEAN_STD", "ACTION": "IDENTITY"})
    module = statistics(identity, normalization="mean_std")
    assert not bool(module.action_statistics_set) and module.proprio_mean.tolist() == [0.5, -1.0, 2.0, 0.0]
    base = write_lerobot_processors(tmp_path / "base", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
                                    with_statistics=False)  # as a base model's, trained on no one dataset
    with pytest.raises(ValueError, match=rf"^{base}: no norm_stats.json there nor under its assets/ \(openpi keeps "
                                         r"it in assets/<asset_id>/\) \(its policy_preprocessor.json holds no "
                                         r"statistics of the actions\)"):
        statistics(base, normalization="mean_std")
    missing = write_lerobot_processors(tmp_path / "gone", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    (missing / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").unlink()
    with pytest.raises(ValueError, match=r"policy_postprocessor.json: its unnormalizer_processor step's statistics, "
                                         r"policy_postprocessor_step_0_unnormalizer_processor.safetensors, are not in"):
        statistics(missing, normalization="mean_std")
    (missing / "policy_postprocessor_step_0_unnormalizer_processor.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match=r"unnormalizer_processor.safetensors: not a safetensors file of statistics"):
        statistics(missing, normalization="mean_std")
    (missing / "policy_preprocessor.json").write_text(json.dumps({"steps": "none"}))
    with pytest.raises(ValueError, match=r"policy_preprocessor.json: not a LeRobot processor pipeline"):
        statistics(missing, normalization="mean_std")


def test_a_norm_stats_json_wins_over_lerobot_s_files(tmp_path):
    directory = write_lerobot_processors(tmp_path / "both", {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    (directory / "norm_stats.json").write_text(json.dumps(
        {"norm_stats": {"actions": {"mean": [7.0] * 3, "std": [1.0] * 3}}}))
    module = statistics(directory, normalization="mean_std")
    assert module.action_mean.tolist() == [7.0] * 3 and not bool(module.proprio_statistics_set)


def test_a_policy_and_its_pre_flight_read_the_files_beside_a_checkpoint(tmp_path):
    """The policy's construction and the pre-flight check both read them: the policy's actions are
    un-normalised with the unnormalizer's mean and std (openpi's formula, x * (std + 1e-6) + mean)."""
    from policies import make_policy
    from policies.pi0.checks_pi0 import check_pretrained
    from tests.policies.pi0_helpers import ACTION_DIM, PROPRIO_DIM, tiny_config

    source = make_policy("pi0", tiny_config(seed=5))
    directory = source.save_pretrained(tmp_path / "ckpt")
    write_lerobot_processors(directory, {"STATE": "MEAN_STD", "ACTION": "MEAN_STD"})
    config = PI0PolicyConfig(model_path=str(directory), action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM,
                             normalization="mean_std")
    check_pretrained(config)
    policy = make_policy("pi0", config)
    own = torch.zeros(1, 4, 20)  # the tiny model's own actions; the executed ones are the last 5 values' first 3
    own[0, :, 15:18] = torch.tensor([[1.0, -1.0, 0.5], [0.0, 2.0, -3.0], [0.0, 0.0, 0.0], [4.0, -4.0, 1.0]])
    mean, std = torch.tensor(ACTION["mean"][:3]), torch.tensor(ACTION["std"][:3])
    torch.testing.assert_close(policy.env_actions(own)[0], own[0, :, 15:18] * (std + 1e-6) + mean)
    with pytest.raises(ValueError, match=r"set policy.config.normalization=mean_std"):
        check_pretrained(PI0PolicyConfig(model_path=str(directory), action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM))


def test_a_checkpoint_of_lerobot_before_0_4_names_lerobot_s_migration(tmp_path):
    """LeRobot saved the statistics as normalize_inputs.* tensors in model.safetensors before 0.4;
    they were refused as unexpected tensors, with advice to load a checkpoint of this architecture."""
    from safetensors.torch import load_file

    from policies import make_policy
    from tests.policies.pi0_helpers import ACTION_DIM, PROPRIO_DIM, tiny_config

    directory = make_policy("pi0", tiny_config(seed=5)).save_pretrained(tmp_path / "old")
    weights = load_file(directory / "model.safetensors")
    weights |= {"normalize_inputs.buffer_observation_state.mean": torch.zeros(4),
                "unnormalize_outputs.buffer_action.std": torch.ones(3)}
    save_file(weights, directory / "model.safetensors")
    with pytest.raises(ValueError, match=r"model.safetensors: holds LeRobot's normalisation statistics as tensors "
                                         r"\(normalize_inputs.buffer_observation_state.mean, "
                                         r"unnormalize_outputs.buffer_action.std\), as LeRobot saved its policies "
                                         r"before 0.4; convert the checkpoint with LeRobot's "
                                         r"src/lerobot/processor/migrate_policy_normalization.py"):
        make_policy("pi0", PI0PolicyConfig(model_path=str(directory), action_dim=ACTION_DIM, proprio_dim=PROPRIO_DIM))
