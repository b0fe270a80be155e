"""Client observation layouts (openpi's LIBERO, DROID and ALOHA clients, LeRobot's keys, the
engine's own) map onto a served policy's inputs; anything else is one clear error."""

from __future__ import annotations

import numpy as np
import pytest

from vla_rl.serving.inputs import ObservationError, ServedInputs
from vla_rl_core.observations import decode_instruction

CAMERAS = ServedInputs(8, {"agentview": (4, 6, 3), "robot0_eye_in_hand": (4, 6, 3)}, "lift the cube")
rng = np.random.default_rng(0)
STATE = rng.normal(size=8)
FRONT = rng.integers(0, 255, size=(4, 6, 3), dtype=np.uint8)
WRIST = rng.integers(0, 255, size=(4, 6, 3), dtype=np.uint8)


def check(obs, prompt="lift the cube") -> None:
    assert obs["state"].dtype == np.float32
    np.testing.assert_array_equal(obs["state"], STATE.astype(np.float32))
    np.testing.assert_array_equal(obs["agentview_image"], FRONT)
    np.testing.assert_array_equal(obs["robot0_eye_in_hand_image"], WRIST)
    assert decode_instruction(obs["instruction"]) == prompt


@pytest.mark.parametrize("request_", [
    {"state": STATE, "agentview_image": FRONT, "robot0_eye_in_hand_image": WRIST, "prompt": "stack it"},
    {"observation/state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST, "prompt": "stack it"},
    {"observation/joint_position": STATE[:7], "observation/gripper_position": STATE[7:],
     "observation/exterior_image_1_left": FRONT, "observation/wrist_image_left": WRIST, "prompt": "stack it"},
    {"state": STATE, "images": {"cam_high": np.moveaxis(FRONT, -1, 0), "cam_left_wrist": np.moveaxis(WRIST, -1, 0),
                                "cam_low": FRONT}, "prompt": "stack it"},
    {"observation.state": STATE, "observation.images.agentview": FRONT,
     "observation.images.robot0_eye_in_hand": WRIST, "task": "stack it", "extra": 1},
], ids=["engine", "libero", "droid", "aloha", "lerobot"])
def test_every_documented_layout_maps_to_the_same_observation(request_):
    check(CAMERAS.engine_observation(request_), "stack it")


def test_the_training_instruction_is_the_default_prompt_and_a_flat_policy_takes_the_state_alone():
    check(CAMERAS.engine_observation({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST}))
    flat = ServedInputs(8).engine_observation({"state": list(STATE)})
    assert isinstance(flat, np.ndarray) and flat.dtype == np.float32 and flat.shape == (8,)


@pytest.mark.parametrize("prompt", [np.str_("stack it"), np.array("stack it"), np.array(["stack it"]),
                                    np.array(b"stack it"), b"stack it"],
                         ids=["np.str_", "0-d array", "1-element array", "bytes array", "bytes"])
def test_a_prompt_in_numpy_s_string_types_is_taken_as_openpi_takes_it(prompt):
    check(CAMERAS.engine_observation({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST,
                                      "prompt": prompt}), "stack it")


def test_a_task_set_policy_reads_the_task_id():
    inputs = ServedInputs(8, num_tasks=10)
    obs = inputs.engine_observation({"state": STATE, "task_id": np.int64(3)})
    assert obs["task_id"] == 3 and obs["task_id"].dtype == np.int64
    with pytest.raises(ObservationError, match=r"'task_id' must be an int in \[0, 10\).*got 10"):
        inputs.engine_observation({"state": STATE, "task_id": 10})


@pytest.mark.parametrize("request_, message", [
    ([1, 2], "must be a dict, got list"),
    ({"joints": STATE}, "has no state: send 8 float values under 'state'"),
    ({"state": STATE[:5]}, r"state has shape \(5,\); the policy takes a state of shape \(8,\)"),
    ({"state": ["a"] * 8}, "state must be numbers"),
    ({"state": np.full(8, np.nan)}, "non-finite"),
    ({"state": np.full(8, 1e39)}, "state holds non-finite values"),  # finite in float64, inf in float32
    ({"observation/joint_position": STATE[:7], "observation/gripper_position": [np.inf]},
     "observation/gripper_position holds non-finite values"),
    ({"observation/joint_position": STATE[:7]}, "has observation/joint_position but no observation/gripper_position"),
    ({"observation/gripper_position": STATE[7:]},
     "has observation/gripper_position but no observation/joint_position"),
    ({"state": STATE, "observation/image": FRONT}, "no image of camera 'robot0_eye_in_hand'"),
    ({"state": STATE, "observation/image": FRONT.astype(np.float32), "observation/wrist_image": WRIST},
     "observation/image is a float32 array; images are uint8"),
    ({"state": STATE, "observation/image": FRONT[:2], "observation/wrist_image": WRIST},
     r"observation/image has shape \(2, 6, 3\); camera 'agentview' takes \(4, 6, 3\)"),
    ({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST, "prompt": 3},
     "prompt must be a string"),
    ({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST,
      "prompt": np.array(["stack it", "lift it"])}, "prompt must be a string, got ndarray"),
])
def test_malformed_observations_are_one_line_naming_the_key(request_, message):
    with pytest.raises(ObservationError, match=message):
        CAMERAS.engine_observation(request_)


def test_an_overlong_prompt_is_refused_in_a_short_line():
    """A 10 KB prompt: the error names its size and shows its start, not all of it (the reply and
    the server's log line held the whole prompt)."""
    with pytest.raises(ObservationError) as refused:
        CAMERAS.engine_observation({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST,
                                    "prompt": "lift " * 2000})
    message = str(refused.value)
    assert "(10000 bytes)" in message and "1..256 UTF-8 bytes" in message and len(message) < 300


def test_without_a_default_instruction_the_client_must_send_one():
    inputs = ServedInputs(8, {"agentview": (4, 6, 3)})
    with pytest.raises(ObservationError, match="no instruction: send it as a string under 'prompt'"):
        inputs.engine_observation({"state": STATE, "agentview_image": FRONT})


def test_the_first_state_key_found_wins():
    other = np.zeros(8)
    flat = ServedInputs(8).engine_observation({"observation.state": other, "observation/state": other,
                                               "state": STATE})
    np.testing.assert_array_equal(flat, STATE.astype(np.float32))


def test_a_boolean_state_is_taken_as_zeros_and_ones():
    flat = ServedInputs(3).engine_observation({"state": np.array([True, False, True])})
    assert flat.dtype == np.float32 and flat.tolist() == [1.0, 0.0, 1.0]


def test_a_task_id_of_true_is_refused():
    with pytest.raises(ObservationError, match=r"'task_id' must be an int in \[0, 10\).*got True"):
        ServedInputs(8, num_tasks=10).engine_observation({"state": STATE, "task_id": True})


def test_an_image_three_rows_high_is_not_taken_for_channels_first():
    inputs = ServedInputs(8, {"agentview": (3, 4, 3)}, "lift the cube")
    image = rng.integers(0, 255, size=(3, 4, 3), dtype=np.uint8)
    np.testing.assert_array_equal(inputs.engine_observation({"state": STATE, "agentview_image": image})[
        "agentview_image"], image)


def test_a_channels_first_image_arrives_row_major_in_height_width_channels():
    channels_first = np.ascontiguousarray(np.moveaxis(FRONT, -1, 0))  # (3, 4, 6), as ALOHA's client sends
    obs = CAMERAS.engine_observation({"state": STATE, "observation/image": channels_first,
                                      "observation/wrist_image": WRIST})
    np.testing.assert_array_equal(obs["agentview_image"], FRONT)
    assert obs["agentview_image"].flags.c_contiguous


def test_an_image_under_the_cameras_own_name_wins_over_alohas_by_position():
    obs = CAMERAS.engine_observation({"state": STATE, "images": {"cam_high": np.zeros_like(FRONT), "agentview": FRONT,
                                                                 "robot0_eye_in_hand": WRIST}})
    check(obs)


def test_a_prompt_of_utf8_bytes_is_decoded_as_utf8():
    obs = CAMERAS.engine_observation({"state": STATE, "observation/image": FRONT, "observation/wrist_image": WRIST,
                                      "prompt": "put the crème brûlée away".encode()})
    assert decode_instruction(obs["instruction"]) == "put the crème brûlée away"


def test_the_inputs_described_and_built_from_a_spec():
    from vla_rl_core.env_spec import EnvSpec

    assert CAMERAS.describe() == {"state": [8], "images": {"agentview": [4, 6, 3], "robot0_eye_in_hand": [4, 6, 3]},
                                  "prompt": "lift the cube"}
    assert ServedInputs(5, num_tasks=3).describe() == {"state": [5], "num_tasks": 3}
    state_only = ServedInputs.from_spec(EnvSpec(obs_dim=5, action_dim=2, horizon=4), "lift the cube")
    assert state_only == ServedInputs(5)  # a state-only policy takes no instruction
