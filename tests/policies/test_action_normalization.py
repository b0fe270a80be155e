"""bounds_q99 normalisation, statistics loading and the LIBERO gripper post-processing."""

from __future__ import annotations

import pytest
import torch

from policies.action_normalization import (
    libero_gripper_postprocess,
    libero_unnorm_key,
    load_action_statistics,
)
from policies.normalization import ActionStatistics

STATS = {"q01": [-0.5, 0.0, -2.0], "q99": [0.5, 4.0, 2.0], "mask": [True, True, False]}


def test_q01_q99_map_to_the_bounds_and_the_mask_passes_through():
    stats = ActionStatistics.from_dict(STATS, "test")
    raw = torch.tensor([[-0.5, 0.0, 0.7], [0.5, 4.0, -3.0], [0.0, 2.0, 1.0], [9.0, -9.0, 0.0]])
    normalized = stats.normalize(raw)
    expected = torch.tensor([[-1.0, -1.0, 0.7], [1.0, 1.0, -3.0], [0.0, 0.0, 1.0], [1.0, -1.0, 0.0]])
    torch.testing.assert_close(normalized, expected, rtol=0, atol=1e-6)
    # De-normalisation: 0.5 (a + 1) (q99 - q01) + q01 on masked dimensions.
    denormalized = stats.denormalize(torch.tensor([[-1.0, 1.0, 0.25], [0.5, -0.5, -1.0]]))
    torch.testing.assert_close(denormalized, torch.tensor([[-0.5, 4.0, 0.25], [0.25, 1.0, -1.0]]), rtol=0, atol=1e-6)
    torch.testing.assert_close(stats.denormalize(normalized[:3]), raw[:3], rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="actions"):
        stats.normalize(torch.zeros(2, 4))


def test_libero_gripper_is_rescaled_binarised_and_inverted():
    actions = torch.tensor([[0.3, 0.0], [0.3, 1.0], [0.3, 0.2], [0.3, 0.8]])
    processed = libero_gripper_postprocess(actions)
    assert processed[:, -1].tolist() == [1.0, -1.0, 1.0, -1.0]
    assert torch.equal(processed[:, 0], actions[:, 0])


def test_libero_gripper_matches_normalize_then_invert_of_the_reference_on_chunks():
    # robot_utils.normalize_gripper_action(binarize=True): sign(2 g - 1); invert_gripper_action: -g.
    gripper = torch.tensor([0.0, 0.49, 0.5, 0.51, 1.0])
    chunk = torch.zeros(1, 5, 7)  # (batch, chunk, action_dim)
    chunk[0, :, -1] = gripper
    chunk[0, :, 0] = torch.arange(5.0)
    processed = libero_gripper_postprocess(chunk)
    reference = -torch.sign(2 * (gripper - 0.0) / (1.0 - 0.0) - 1)
    assert torch.equal(processed[0, :, -1], reference)
    assert processed[0, :, -1].tolist() == [1.0, 1.0, 0.0, -1.0, -1.0]  # 0.5: sign(0) = 0, as the reference
    assert torch.equal(processed[..., :-1], chunk[..., :-1]) and chunk[0, 0, -1] == 0.0  # a copy


def test_statistics_selection_errors_name_the_choices():
    norm_stats = {"libero_spatial": {"action": STATS}, "bridge": {"action": STATS}}
    with pytest.raises(ValueError, match="bridge"):
        load_action_statistics(norm_stats, None, "dataset_statistics.json")
    with pytest.raises(ValueError, match="libero_goal"):
        load_action_statistics(norm_stats, "libero_goal", "dataset_statistics.json")
    assert load_action_statistics(norm_stats, "bridge", "x").action_dim == 3
    with pytest.raises(ValueError, match="q99"):
        ActionStatistics.from_dict({"q01": [0.0]}, "x")


@pytest.mark.parametrize(("keys", "expected"), [
    (["libero_spatial_no_noops"], "libero_spatial_no_noops"),
    (["libero_spatial", "libero_spatial_no_noops"], "libero_spatial"),
    (["libero_10_no_noops", "libero_spatial_no_noops", "libero_goal"], "libero_spatial_no_noops"),
])
def test_the_suite_picks_its_key_or_its_no_noops_key_as_check_unnorm_key(keys, expected):
    # run_libero_eval.py check_unnorm_key: the suite's name, else "<suite>_no_noops" if present.
    assert libero_unnorm_key({key: {} for key in keys}, "libero_spatial", "stats.json") == expected


def test_a_suite_without_statistics_names_the_keys_there_and_the_field():
    with pytest.raises(ValueError, match=r"stats\.json has no statistics of LIBERO suite 'libero_object'.*"
                                         r"\['libero_spatial', 'libero_spatial_no_noops'\].*policy\.config\.unnorm_key"):
        libero_unnorm_key({"libero_spatial": {}, "libero_spatial_no_noops": {}}, "libero_object", "stats.json")
