"""OpenVLA-OFT policy on a tiny in-process model: the parallel pass against an independently
built reference, exact log-probs, greedy decoding, the L1 head, proprio and checkpoints."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from libero_statistics import libero_checkpoint

from policies.openvla.tiny import (
    build_tiny_tokenizer,
    tiny_architecture,
    tiny_observation,
)
from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
from policies.openvla_oft.modeling_openvla_oft import (
    OpenVLAOFTPolicy,
    parallel_decoding_mask,
)

INSTRUCTIONS = ["pick up the black bowl", "turn on the stove", "open the top drawer of the cabinet"]
CHUNK, ACTION_DIM, PROPRIO_DIM = 4, 7, 8


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def policy(tokenizer):
    config = OpenVLAOFTPolicyConfig(
        architecture=tiny_architecture(len(tokenizer)), chunk_size=CHUNK, num_images=2, proprio_dim=PROPRIO_DIM
    )
    return OpenVLAOFTPolicy(config)


@pytest.fixture(scope="module")
def obs(tokenizer):
    return tiny_observation(tokenizer, INSTRUCTIONS, num_images=2, proprio_dim=PROPRIO_DIM)


def test_mask_is_bidirectional_over_every_position_but_padding():
    """OpenVLA-OFT's transformers fork (moojink/transformers-openvla-oft bc339d9): every query, the
    prefix's included, attends every non-padding key (the prefix was causal here before)."""
    prefix_mask = torch.tensor([[1, 0, 1], [1, 1, 1]])
    allowed = parallel_decoding_mask(prefix_mask, 2, torch.float32)[:, 0] == 0  # (B, 6, 6)
    assert bool(allowed[1].all())
    assert torch.equal(allowed[0], torch.tensor([1, 0, 1, 1, 1, 1], dtype=torch.bool).expand(6, 6))


def test_the_prefix_sees_the_placeholders_as_in_the_reference(policy, obs):
    """The fork's rule (Llama's causal mask, padding included, replaced by its last row for every
    query) built from transformers' own causal mask, against ours: the logits agree."""
    vla = policy.vla
    with torch.no_grad():
        proprio_token = policy.proprio_projector(obs["proprio"])[:, None]
        patches = torch.cat([vla.embed_images(obs["images"]), proprio_token], dim=1)
        text = vla.embed_tokens(obs["input_ids"])
        placeholders = torch.zeros(3, CHUNK * ACTION_DIM, text.shape[-1])
        stop = vla.embed_tokens(torch.full((3, 1), policy.config.stop_token_id))
        embeddings = torch.cat([text[:, :1], patches, text[:, 1:], placeholders, stop], dim=1)
        ones = torch.ones(3, patches.shape[1], dtype=torch.long), torch.ones(3, CHUNK * ACTION_DIM + 1, dtype=torch.long)
        valid = torch.cat([obs["attention_mask"][:, :1], ones[0], obs["attention_mask"][:, 1:], ones[1]], 1)
        total = embeddings.shape[1]
        causal = torch.ones(total, total).tril().bool()[None] & valid[:, None, :].bool()  # Llama's, with padding
        fork = causal[:, -1:, :].expand(-1, total, -1)  # the last row for every query
        mask = torch.zeros(3, 1, total, total).masked_fill(~fork[:, None], torch.finfo(torch.float32).min)
        positions = (valid.cumsum(-1) - 1).clamp(min=0)
        reference = vla.language_model(inputs_embeds=embeddings, attention_mask=mask, position_ids=positions).logits
        first_action = total - CHUNK * ACTION_DIM - 1
        torch.testing.assert_close(policy.action_logits(obs).flatten(1, 2), reference[:, first_action - 1: total - 2],
                                   rtol=0, atol=1e-5)


def reference_scores(policy: OpenVLAOFTPolicy, obs, action_tokens: torch.Tensor) -> torch.Tensor:
    """OFT's training-time pass, built here step by step: the given action tokens are embedded
    and zeroed (``input_embeddings * ~all_actions_mask``), the attention mask (OFT's bidirectional
    one: every non-padding key) is filled in by loops, and the logits are read one position before
    each action token."""
    vla = policy.vla
    with torch.no_grad():
        proprio_token = policy.proprio_projector(obs["proprio"])[:, None]
        patches = torch.cat([vla.embed_images(obs["images"]), proprio_token], dim=1)
        text = vla.embed_tokens(obs["input_ids"])
        actions = vla.embed_tokens(action_tokens.flatten(1)) * 0.0
        stop = vla.embed_tokens(torch.full((3, 1), policy.config.stop_token_id))
        embeddings = torch.cat([text[:, :1], patches, text[:, 1:], actions, stop], dim=1)
        mask_2d = obs["attention_mask"]
        ones = torch.ones(3, patches.shape[1], dtype=torch.long), torch.ones(3, actions.shape[1] + 1, dtype=torch.long)
        valid = torch.cat([mask_2d[:, :1], ones[0], mask_2d[:, 1:], ones[1]], 1)
        total, first_action = embeddings.shape[1], embeddings.shape[1] - actions.shape[1] - 1
        mask = torch.full((3, 1, total, total), torch.finfo(torch.float32).min)
        for b in range(3):
            for i in range(total):
                for j in range(total):
                    if valid[b, j]:  # OFT's fork: every non-padding key, for every query
                        mask[b, 0, i, j] = 0.0
        positions = (valid.cumsum(-1) - 1).clamp(min=0)
        out = vla.language_model(inputs_embeds=embeddings, attention_mask=mask, position_ids=positions)
        return out.logits[:, first_action - 1 : first_action - 1 + actions.shape[1]]


def test_parallel_pass_equals_scoring_given_action_tokens(policy, obs):
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(0), temperature=0.8)
    tokens = policy.action_tokenizer.tokens_from_bins(policy.action_tokenizer.bins_from_actions(actions))
    logits = reference_scores(policy, obs, tokens)  # (B, chunk * A, vocab)
    expected = (policy.action_tokenizer.bin_logits(logits).double() / 0.8).log_softmax(-1)
    with torch.no_grad():
        ours = policy.action_tokenizer.bin_logits(policy.action_logits(obs)).double()
    torch.testing.assert_close((ours / 0.8).log_softmax(-1).flatten(1, 2), expected, rtol=0, atol=1e-5)
    per_dim, _ = policy.log_prob_and_entropy_per_dim(obs, actions, temperature=0.8)
    bins = policy.action_tokenizer.bins_from_actions(actions).flatten(1)
    torch.testing.assert_close(
        per_dim.detach().double().flatten(1), expected.gather(-1, bins[..., None]).squeeze(-1), rtol=0, atol=1e-5
    )
    assert torch.equal(per_dim.sum(-1), log_probs)


def test_ratio_is_one_at_the_first_on_policy_minibatch(policy, obs):
    for greedy in (False, True):
        actions, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(1))
        assert actions.shape == (3, CHUNK, ACTION_DIM) and log_probs.shape == (3, CHUNK)
        recomputed, entropy = policy(obs, actions)
        assert torch.equal(torch.exp(recomputed.sum(-1) - log_probs), torch.ones_like(log_probs))
        assert recomputed.requires_grad and entropy.shape == recomputed.shape


def test_greedy_takes_the_argmax_bins_and_matches_predict_action_chunk(policy, obs):
    actions, _ = policy.sample_actions(obs, greedy=True)
    with torch.no_grad():
        argmax = policy.action_tokenizer.bin_logits(policy.action_logits(obs)).argmax(-1)
    assert torch.equal(policy.action_tokenizer.bins_from_actions(actions), argmax)
    assert torch.equal(policy.predict_action_chunk(obs), actions)
    assert policy.env_actions(actions).shape == (3, CHUNK, ACTION_DIM)


def test_proprio_changes_the_actions_and_is_required(policy, obs):
    with torch.no_grad():
        base = policy.action_logits(obs)
        moved = obs.clone()
        moved["proprio"] = moved["proprio"] + 1.0
        assert not torch.equal(policy.action_logits(moved), base)
    with pytest.raises(ValueError, match="proprio"):
        policy.sample_actions(obs.exclude("proprio"))
    with pytest.raises(ValueError, match="images"):
        policy.sample_actions(obs.apply(lambda t: t[:, :1] if t.ndim == 5 else t))


def test_l1_head_regresses_and_has_no_distribution(tokenizer):
    config = OpenVLAOFTPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=False), chunk_size=CHUNK,
                                    action_head="l1_regression")  # fmt: skip
    policy = OpenVLAOFTPolicy(config)
    obs = tiny_observation(tokenizer, INSTRUCTIONS[:2])
    expert = torch.rand(2, CHUNK, ACTION_DIM) * 2 - 1
    loss = policy.bc_loss(obs, expert)
    hidden = policy.action_hidden_states(obs)  # (B, chunk * A, D): one step's A states concatenated
    predicted = policy.action_head.model(hidden.reshape(2, CHUNK, -1))
    torch.testing.assert_close(loss, (predicted - expert).abs().mean())
    loss.backward()
    assert policy.action_head.model.fc2.weight.grad is not None
    torch.testing.assert_close(policy.predict_action_chunk(obs), predicted.detach())
    with pytest.raises(ValueError, match="discrete"):
        policy.sample_actions(obs)


def test_checkpoint_with_oft_module_files_round_trips(policy, obs, tmp_path):
    out = policy.save_pretrained(tmp_path / "oft")
    written = out / "proprio_projector--checkpoint.pt"
    assert written.is_file()  # save_pretrained writes the head modules the policy uses
    loaded = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, num_images=2,
                                                     proprio_dim=PROPRIO_DIM))
    assert torch.equal(loaded.proprio_projector.fc1.weight, policy.proprio_projector.fc1.weight)
    written.unlink()  # a published file (DDP's "module." prefix, a step in its name) loads as well
    state = {f"module.{name}": tensor for name, tensor in policy.proprio_projector.state_dict().items()}
    torch.save(state, out / "proprio_projector--150000_checkpoint.pt")
    config = OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, num_images=2, proprio_dim=PROPRIO_DIM)
    loaded = OpenVLAOFTPolicy(config)
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(2))
    assert torch.equal(loaded.sample_actions(obs, generator=torch.Generator().manual_seed(2))[1], log_probs)
    with pytest.raises(ValueError, match="action_head"):
        OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), action_head="l1_regression"))


def test_fitted_proprio_statistics_without_action_statistics_save_and_load_back(tokenizer, obs, tmp_path):
    """A robosuite OFT policy has no action statistics (actions already in [-1, 1]) but fits its
    proprio's: the checkpoint keeps them next to a pass-through action entry (``vla-rl export`` of
    an OFT Lift run raised "needs action statistics" with a traceback)."""
    import json

    config = OpenVLAOFTPolicyConfig(architecture=tiny_architecture(len(tokenizer)), chunk_size=CHUNK, num_images=2,
                                    proprio_dim=PROPRIO_DIM)
    policy = OpenVLAOFTPolicy(config)
    proprio = torch.linspace(-3.0, 5.0, len(obs) * PROPRIO_DIM).reshape(len(obs), PROPRIO_DIM)
    policy.fit_observation_normalization(obs.clone().update({"proprio": proprio}))
    assert policy.action_statistics is None and policy.proprio_statistics is not None
    out = policy.save_pretrained(tmp_path / "oft")
    stats = json.loads((out / "dataset_statistics.json").read_text())
    assert list(stats) == ["config"] and stats["config"]["action"]["mask"] == [False] * ACTION_DIM
    loaded = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, num_images=2,
                                                     proprio_dim=PROPRIO_DIM))
    torch.testing.assert_close(loaded.proprio_statistics.q01, policy.proprio_statistics.q01, rtol=0, atol=0)
    torch.testing.assert_close(loaded.proprio_statistics.q99, policy.proprio_statistics.q99, rtol=0, atol=0)
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    again, loaded_log_probs = loaded.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    assert torch.equal(again, actions) and torch.equal(loaded_log_probs, log_probs)
    assert torch.equal(loaded.env_actions(actions), policy.env_actions(actions))  # passed through, not rescaled


def test_a_checkpoint_whose_continuous_head_was_trained_is_refused_for_what_it_cannot_do(tokenizer, tmp_path):
    """OFT's finetune.py with use_l1_regression trains the head alone (L1 on the action hidden
    states): its action tokens were never trained, so RL's discrete head is refused on it, naming
    action_head; a diffusion head is refused whatever the config (vla-rl does not run it)."""
    from policies.checkpoint_files import FieldError

    config = OpenVLAOFTPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=False), chunk_size=CHUNK,
                                    action_head="l1_regression")
    out = OpenVLAOFTPolicy(config).save_pretrained(tmp_path / "oft_l1")
    tokenizer.save_pretrained(str(out))
    assert (out / "action_head--checkpoint.pt").is_file()
    OpenVLAOFTPolicy.check_pretrained(OpenVLAOFTPolicyConfig(model_path=str(out), action_head="l1_regression"))
    with pytest.raises(FieldError, match="fine-tuned with OFT's L1-regression head") as refused:
        OpenVLAOFTPolicy.check_pretrained(OpenVLAOFTPolicyConfig(model_path=str(out)))
    assert refused.value.field == "action_head"
    (out / "noisy_action_projector--150000_checkpoint.pt").write_bytes(b"")
    for head in ("discrete", "l1_regression"):
        with pytest.raises(FieldError, match="diffusion action head"):
            OpenVLAOFTPolicy.check_pretrained(OpenVLAOFTPolicyConfig(model_path=str(out), action_head=head))


# --------------------------------------------------------------------------- OpenVLA-OFT's LIBERO evaluation settings
def test_defaults_follow_the_reference_libero_evaluation():
    config = OpenVLAOFTPolicyConfig(architecture="tiny")
    # prismatic/vla/constants.py LIBERO_CONSTANTS: NUM_ACTIONS_CHUNK 8, ACTION_DIM 7;
    # run_libero_eval.py: center_crop True; openvla_utils.prepare_images_for_vla: resize_image_for_policy.
    assert (config.chunk_size, config.action_dim) == (8, 7)
    assert config.image_resize == "jpeg_lanczos3" and config.center_crop is True
    for field, value in (("image_resize", "bicubic"), ("center_crop", 1)):
        with pytest.raises(ValueError, match=field):
            OpenVLAOFTPolicyConfig(architecture="tiny", **{field: value})


def simulator_observation(images):
    from tensordict import TensorDict

    from vla_rl_core.observations import encode_instruction

    codes = torch.from_numpy(np.stack([encode_instruction("put the bowl on the plate")] * images.shape[0]))
    return TensorDict({"agentview_image": images, "instruction": codes}, batch_size=[images.shape[0]])


def test_simulator_images_are_resized_and_cropped_as_prepare_images_for_vla():
    from policies.openvla.image_preprocessing import (
        center_crop,
        resize_image_for_policy,
    )

    images = torch.randint(0, 256, (2, 40, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    tiny = {"preset": "tiny", "image_size": 28, "fused": False}
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture=tiny, chunk_size=2))
    seen = policy.model_inputs(simulator_observation(images))["images"]
    assert seen.shape == (2, 1, 28, 28, 3)
    for b in range(2):
        expected = center_crop(resize_image_for_policy(images[b].numpy(), 28))
        assert np.array_equal(seen[b, 0].numpy(), expected)
    # already the tower's size: no JPEG round trip or resize, only the crop (as the reference's 224 check)
    exact = torch.randint(0, 256, (1, 28, 28, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    cropped = policy.model_inputs(simulator_observation(exact))["images"][0, 0].numpy()
    assert np.array_equal(cropped, center_crop(exact[0].numpy()))
    plain = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture=tiny, chunk_size=2, image_resize="tower",
                                                    center_crop=False))
    assert torch.equal(plain.model_inputs(simulator_observation(images))["images"][:, 0], images)


def test_each_distinct_frame_is_prepared_once(monkeypatch):
    """The JPEG round trip, Lanczos-3 resize and centre crop ran in every forward pass that read
    a frame (the rollout's, the rescoring's, each epoch's, the reference's); now once per distinct
    frame and settings, least recently used first out, with the same bytes."""
    import policies.openvla.processor_openvla as processor
    from policies.openvla.image_preprocessing import center_crop, resize_image_for_policy

    frames = processor.PreparedFrames(capacity=3)
    monkeypatch.setattr(processor, "PREPARED_FRAMES", frames)
    images = torch.randint(0, 256, (4, 40, 40, 3), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    tiny = {"preset": "tiny", "image_size": 28, "fused": False}
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture=tiny, chunk_size=2))
    reference = copy.deepcopy(policy)  # the KL reference: another processor, the same frames
    first = policy.model_inputs(simulator_observation(images[[0, 1, 0]]))["images"]
    assert frames.prepared == 2  # frame 0 twice in the batch, prepared once
    again = reference.model_inputs(simulator_observation(images[[1, 0]]))["images"]
    assert frames.prepared == 2 and torch.equal(again, first[[1, 0]])
    for b in range(2):
        assert np.array_equal(first[b, 0].numpy(), center_crop(resize_image_for_policy(images[b].numpy(), 28)))
    policy.model_inputs(simulator_observation(images[2:]))  # frames 2 and 3: frame 1 (least recent) leaves
    assert frames.prepared == 4 and len(frames.frames) == 3
    policy.model_inputs(simulator_observation(images[[0]]))
    assert frames.prepared == 4
    policy.model_inputs(simulator_observation(images[[1]]))
    assert frames.prepared == 5
    uncropped = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture=tiny, chunk_size=2, center_crop=False))
    plain = uncropped.model_inputs(simulator_observation(images[[0]]))["images"][0, 0].numpy()
    assert frames.prepared == 6 and np.array_equal(plain, resize_image_for_policy(images[0].numpy(), 28))


# --------------------------------------------------------------------------- LIBERO: the suite picks the statistics
def suite(name: str):
    from simulators.libero_env import LiberoEnvConfig

    return LiberoEnvConfig(suite=name)


def denormalized_zero(policy) -> float:
    """The de-normalised value of a normalised 0 (index + 1 of the dataset acting)."""
    return float(policy.env_actions(torch.zeros(1, CHUNK, ACTION_DIM))[0, 0, 0])


def test_a_libero_suite_takes_its_no_noops_statistics_when_only_those_exist(tokenizer, tmp_path):
    out = libero_checkpoint(tmp_path / "oft", ["libero_spatial_no_noops"], CHUNK)
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, proprio_dim=PROPRIO_DIM))
    policy.use_tasks("libero", [suite("libero_spatial")])
    assert policy.unnorm_key == "libero_spatial_no_noops" and denormalized_zero(policy) == 1.0
    assert policy.proprio_statistics.q01.tolist() == [0.0] * PROPRIO_DIM
    with pytest.raises(ValueError, match=r"no statistics of LIBERO suite 'libero_object'.*"
                                         r"\['libero_spatial_no_noops'\].*policy\.config\.unnorm_key"):
        policy.use_tasks("libero", [suite("libero_object")])


def test_each_libero_suite_acts_with_its_own_statistics(tokenizer, tmp_path):
    datasets = ["libero_spatial", "libero_spatial_no_noops", "libero_goal_no_noops"]
    out = libero_checkpoint(tmp_path / "oft", datasets, CHUNK)
    config = OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, proprio_dim=PROPRIO_DIM)
    policy = OpenVLAOFTPolicy(config)
    assert policy.unnorm_key is None  # several datasets: no guess
    with pytest.raises(ValueError, match=r"policy\.config\.unnorm_key"):
        policy.env_actions(torch.zeros(1, CHUNK, ACTION_DIM))
    policy.use_tasks("libero", [suite("libero_spatial")])  # the run's suite: the policy's own dataset
    assert policy.unnorm_key == "libero_spatial" and denormalized_zero(policy) == 1.0
    assert policy.proprio_q01.tolist() == [0.0] * PROPRIO_DIM and bool(policy.proprio_statistics_set)
    policy.use_tasks("libero", [suite("libero_goal")])  # an evaluation task of another suite
    assert denormalized_zero(policy) == 3.0 and policy.proprio_statistics.q01.tolist() == [2.0] * PROPRIO_DIM
    assert policy.proprio_q01.tolist() == [0.0] * PROPRIO_DIM  # the policy's own (trained) buffers stay
    policy.use_tasks("libero", [suite("libero_spatial")])
    assert denormalized_zero(policy) == 1.0 and policy.proprio_statistics.q01.tolist() == [0.0] * PROPRIO_DIM
    with pytest.raises(ValueError, match="different statistics"):
        policy.use_tasks("libero", [suite("libero_spatial"), suite("libero_goal")])
    explicit = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(out), chunk_size=CHUNK, proprio_dim=PROPRIO_DIM,
                                                       unnorm_key="libero_spatial_no_noops"))
    explicit.use_tasks("libero", [suite("libero_spatial")])
    explicit.use_tasks("libero", [suite("libero_goal")])
    assert explicit.unnorm_key == "libero_spatial_no_noops" and denormalized_zero(explicit) == 2.0  # the key wins


def test_two_camera_inputs_are_agentview_then_wrist_with_the_8_value_proprio():
    """run_libero_eval: num_images_in_input = 2 (full image, then wrist image), use_proprio = True:
    the processor reads agentview first, robot0_eye_in_hand second, and the state's first 8 values."""
    from tensordict import TensorDict

    from vla_rl_core.observations import encode_instruction

    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "image_size": 28},
                                                     chunk_size=CHUNK, num_images=2, proprio_dim=PROPRIO_DIM))
    assert policy.config.cameras == ("agentview", "robot0_eye_in_hand") and policy.config.proprio_dim == PROPRIO_DIM
    state = torch.arange(2 * 10, dtype=torch.float32).reshape(2, 10)
    code = torch.from_numpy(encode_instruction(INSTRUCTIONS[0]))
    obs = TensorDict({"state": state, "instruction": code.expand(2, -1).clone(),
                      "agentview_image": torch.full((2, 64, 64, 3), 40, dtype=torch.uint8),
                      "robot0_eye_in_hand_image": torch.full((2, 64, 64, 3), 200, dtype=torch.uint8)},
                     batch_size=[2])
    inputs = policy.processor(obs)
    images = inputs["images"].float()
    assert images.shape[:2] == (2, 2)
    assert (images[:, 0] - 40).abs().max() <= 1 and (images[:, 1] - 200).abs().max() <= 1  # uniform stays uniform
    torch.testing.assert_close(inputs["proprio"], state[:, :PROPRIO_DIM])


def test_the_oft_config_is_openvlas_with_oft_defaults_and_fields():
    import dataclasses

    from policies import make_policy
    from policies.openvla.configuration_openvla import OpenVLAPolicyConfig

    oft, openvla = OpenVLAOFTPolicyConfig(architecture="tiny"), OpenVLAPolicyConfig(architecture="tiny")
    own = {f.name for f in dataclasses.fields(OpenVLAOFTPolicyConfig)} - {f.name for f in dataclasses.fields(openvla)}
    assert own == {"chunk_size", "num_images", "proprio_dim", "action_head", "stop_token_id"}
    assert (oft.image_resize, oft.center_crop) == ("jpeg_lanczos3", True)  # OFT's LIBERO preprocessing
    assert (openvla.image_resize, openvla.center_crop) == ("tower", False)
    with pytest.raises(ValueError, match="OpenVLAOFTPolicyConfig.temperature"):  # the shared checks name the class
        OpenVLAOFTPolicyConfig(architecture="tiny", temperature=0)
    with pytest.raises(TypeError, match="OpenVLAPolicy needs an OpenVLAPolicyConfig, got OpenVLAOFTPolicyConfig"):
        make_policy("openvla", oft)
