"""OpenVLA policy on a tiny in-process model: exact log-probs, restricted softmax, greedy decoding,
environment actions, the published checkpoint layout and LoRA."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open
from tensordict import TensorDict
from torch.nn import functional as F

from policies.image_resize import resize_uint8
from policies.openvla.checkpoint_prismatic import (
    architecture_from_config,
    write_checkpoint,
)
from policies.openvla.configuration_openvla import OpenVLAPolicyConfig
from policies.openvla.modeling_openvla import OpenVLAPolicy
from policies.openvla.tiny import (
    build_tiny_tokenizer,
    tiny_architecture,
    tiny_observation,
)

INSTRUCTIONS = ["pick up the black bowl", "turn on the stove", "open the top drawer of the cabinet"]
STATS = {
    "q01": [-0.9, -0.8, -0.7, -0.2, -0.3, -0.4, 0.0],
    "q99": [0.9, 0.8, 0.9, 0.2, 0.3, 0.1, 1.0],
    "mask": [True] * 6 + [False],
}


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def policy(tokenizer):
    config = OpenVLAPolicyConfig(
        architecture=tiny_architecture(len(tokenizer)), action_statistics=STATS, gripper_postprocess="libero"
    )
    return OpenVLAPolicy(config)


@pytest.fixture(scope="module")
def obs(tokenizer):
    return tiny_observation(tokenizer, INSTRUCTIONS)


def test_ratio_is_one_at_the_first_on_policy_minibatch(policy, obs):
    """The rollout's log-probs come from the decoding pass (cached); the training forward is
    teacher-forced: the ratio is 1 up to float rounding."""
    for greedy in (False, True):
        actions, log_probs = policy.sample_actions(obs, greedy=greedy, generator=torch.Generator().manual_seed(1))
        assert actions.shape == (3, 1, 7) and log_probs.shape == (3, 1)
        recomputed, entropy = policy(obs, actions)  # the training forward
        assert recomputed.requires_grad
        torch.testing.assert_close(recomputed.sum(-1), log_probs, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.exp(recomputed.sum(-1) - log_probs), torch.ones_like(log_probs),
                                   rtol=0, atol=1e-5)
        assert (entropy > 0).all() and (entropy <= math.log(256) + 1e-5).all()


def test_sampling_scores_its_tokens_in_the_decoding_pass(policy, obs):
    """One language-model call per action token (the prefix, then one cached step per further
    token) and no teacher-forced pass after it."""
    calls = []
    handle = policy.vla.language_model.model.register_forward_hook(lambda module, args, out: calls.append(1))
    try:
        policy.sample_actions(obs, generator=torch.Generator().manual_seed(1))
    finally:
        handle.remove()
    assert len(calls) == policy.action_dim


def test_log_probs_are_the_restricted_softmax_at_the_temperature(policy, obs):
    actions, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(2), temperature=0.7)
    with torch.no_grad():
        log_probs, entropy = policy.log_prob_and_entropy_per_dim(obs, actions, temperature=0.7)
        bins = policy.action_tokenizer.bins_from_actions(actions[:, 0])
        logits, tokens = policy._bin_logits(obs, bins)  # full-vocabulary logits at the 7 positions
    end = policy.action_tokenizer.vocab_end
    for row in range(3):
        for dim in range(7):
            action_logits = logits[row, dim, end - 256 : end].double() / 0.7
            log_z = torch.logsumexp(action_logits, 0)
            expected = action_logits[int(tokens[row, dim]) - (end - 256)] - log_z
            assert abs(float(log_probs[row, 0, dim]) - float(expected)) < 1e-5
            p = (action_logits - log_z).exp()
            assert abs(float(entropy[row, 0, dim]) + float((p * p.log()).sum())) < 1e-5


def test_greedy_takes_the_argmax_bin_of_every_dimension(policy, obs):
    actions, _ = policy.sample_actions(obs, greedy=True)
    bins = policy.action_tokenizer.bins_from_actions(actions[:, 0])
    logits, _ = policy._bin_logits(obs, bins)  # each position conditioned on the greedy prefix
    assert torch.equal(policy.action_tokenizer.bin_logits(logits).argmax(-1), bins)


def test_sampling_follows_the_generator_and_the_temperature(policy, obs):
    first, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    second, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(3))
    assert torch.equal(first, second)
    cold, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(4), temperature=1e-4)
    greedy, _ = policy.sample_actions(obs, greedy=True)
    assert torch.equal(cold, greedy)


def test_env_actions_decode_denormalise_and_post_process_the_gripper(policy):
    bins = torch.tensor([[0, 255, 127, 128, 40, 200, 255], [255, 0, 3, 250, 254, 1, 0]])
    actions = policy.action_tokenizer.actions_from_bins(bins)[:, None]
    edges = np.linspace(-1, 1, 256)
    centers = (edges[:-1] + edges[1:]) / 2
    normalized = centers[np.clip(bins.numpy(), 0, 254)]  # OpenVLA's predict_action decoding
    q01, q99, mask = (np.array(STATS[k]) for k in ("q01", "q99", "mask"))
    raw = np.where(mask, 0.5 * (normalized + 1) * (q99 - q01) + q01, normalized)
    raw[:, -1] = -np.sign(2 * raw[:, -1] - 1)  # LIBERO: [0, 1] -> [-1, 1], binarise, invert
    np.testing.assert_allclose(policy.env_actions(actions)[:, 0].numpy(), raw, rtol=0, atol=1e-6)


def test_actions_from_env_invert_env_actions_up_to_the_bin_width(policy):
    """Demonstrated environment actions → normalised policy actions (gripper post-processing
    undone, bounds_q99) → bins → environment actions: back within a bin of de-normalised width."""
    q01, q99 = np.array(STATS["q01"]), np.array(STATS["q99"])
    rng = np.random.default_rng(0)
    env = q01 + (q99 - q01) * rng.uniform(0.05, 0.95, size=(5, 7))
    env[:, -1] = [-1, 1, 1, -1, 1]  # LIBERO gripper: -1 open, +1 close
    env = torch.tensor(env, dtype=torch.float32)[:, None]  # (5, 1, 7)
    policy_actions = policy.actions_from_env(env)
    assert policy_actions[..., :6].abs().max() <= 1.0
    torch.testing.assert_close(policy_actions[:, 0, -1], torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0]))  # datasets: 1 open
    bin_values = policy.action_tokenizer.actions_from_bins(policy.action_tokenizer.bins_from_actions(policy_actions))
    back = policy.env_actions(bin_values)
    bin_width = torch.tensor((q99 - q01) * 2 / 255, dtype=torch.float32)
    assert ((back - env)[..., :6].abs() <= bin_width[:6]).all()
    assert torch.equal(back[..., -1], env[..., -1])


def test_bc_loss_is_the_full_vocabulary_cross_entropy(policy, obs):
    expert = torch.rand(3, 1, 7) * 2 - 1
    loss = policy.bc_loss(obs, expert)
    logits, tokens = policy._bin_logits(obs, policy.action_tokenizer.bins_from_actions(expert[:, 0]))
    expected = -logits.double().log_softmax(-1).gather(-1, tokens[..., None]).mean()
    assert abs(loss.item() - expected.item()) < 1e-5
    loss.backward()
    assert policy.vla.projector.fc1.weight.grad is not None
    policy.zero_grad(set_to_none=True)


def test_malformed_inputs_raise_naming_the_field(policy, obs):
    with pytest.raises(ValueError, match="images"):
        policy.sample_actions(obs.exclude("images"))
    bad = obs.clone()
    bad["attention_mask"][0, 0] = 0
    with pytest.raises(ValueError, match="attention_mask"):
        policy.sample_actions(bad)
    with pytest.raises(ValueError, match="actions"):
        policy.log_prob_and_entropy(obs, torch.zeros(3, 7))
    with pytest.raises(ValueError, match="expert_actions"):
        policy.bc_loss(obs, torch.zeros(2, 1, 7))
    with pytest.raises(ValueError, match="exactly one of model_path") as neither:
        OpenVLAPolicyConfig()
    assert "both are set" not in str(neither.value)
    with pytest.raises(ValueError, match="both are set: set architecture to null to load model_path"):
        OpenVLAPolicyConfig(model_path="/data/openvla", architecture={"preset": "tiny"})  # a template's tiny model kept


def timm_vit_patches(tensors: dict, prefix: str, pixels: torch.Tensor, heads: int, family: str) -> torch.Tensor:
    """A timm VisionTransformer ``get_intermediate_layers(n={L - 2})`` written from timm's Block /
    Attention forward, reading the published (timm-named) tensors."""

    def t(name):
        return tensors[prefix + name]

    patch = t("patch_embed.proj.weight").shape[-1]
    x = F.conv2d(pixels, t("patch_embed.proj.weight"), t("patch_embed.proj.bias"), stride=patch)
    x = x.flatten(2).transpose(1, 2) + t("pos_embed")  # (B, N, D); no_embed_class for DINOv2
    num_prefix = 0
    if family == "dinov2":
        batch = x.shape[0]
        x = torch.cat([t("cls_token").expand(batch, -1, -1), t("reg_token").expand(batch, -1, -1), x], 1)
        num_prefix = 1 + t("reg_token").shape[1]
    width = x.shape[-1]
    depth = 1 + max(int(name[len(prefix) :].split(".")[1]) for name in tensors if name.startswith(prefix + "blocks."))
    for i in range(depth - 1):  # up to the second-to-last block
        b = f"blocks.{i}."
        h = F.layer_norm(x, (width,), t(b + "norm1.weight"), t(b + "norm1.bias"), eps=1e-6)
        qkv = F.linear(h, t(b + "attn.qkv.weight"), t(b + "attn.qkv.bias"))
        q, k, v = qkv.reshape(x.shape[0], x.shape[1], 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        attn = ((q @ k.transpose(-2, -1)) / math.sqrt(width // heads)).softmax(-1) @ v
        attn = F.linear(attn.transpose(1, 2).reshape(x.shape), t(b + "attn.proj.weight"), t(b + "attn.proj.bias"))
        x = x + (attn * t(b + "ls1.scale_factor") if family == "dinov2" else attn)
        h = F.layer_norm(x, (width,), t(b + "norm2.weight"), t(b + "norm2.bias"), eps=1e-6)
        h = F.gelu(F.linear(h, t(b + "mlp.fc1.weight"), t(b + "mlp.fc1.bias")))
        h = F.linear(h, t(b + "mlp.fc2.weight"), t(b + "mlp.fc2.bias"))
        x = x + (h * t(b + "ls2.scale_factor") if family == "dinov2" else h)
    return x[:, num_prefix:]


def test_checkpoint_round_trip_in_the_published_layout(policy, obs, tokenizer, tmp_path):
    with torch.no_grad():  # non-trivial LayerScale, registers and CLS so that the mapping matters
        for name, parameter in policy.vla.named_parameters():
            if name.endswith(("lambda1", "register_tokens", "cls_token", "position_embeddings")):
                parameter.normal_()
    policy.tokenizer = tokenizer
    out = policy.save_pretrained(tmp_path / "ckpt", vision_backbone_id="dinosiglip-vit-so-224px")
    policy.tokenizer = None
    assert not (out / "model.safetensors.index.json").exists()  # small enough for one file
    with safe_open(out / "model.safetensors", "pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    for name in (
        "vision_backbone.featurizer.blocks.0.attn.qkv.weight",
        "vision_backbone.featurizer.blocks.2.ls1.scale_factor",
        "vision_backbone.featurizer.reg_token",
        "vision_backbone.fused_featurizer.blocks.0.attn.qkv.bias",
        "vision_backbone.fused_featurizer.pos_embed",
        "projector.fc3.weight",
        "language_model.model.layers.1.self_attn.q_proj.weight",
        "language_model.lm_head.weight",
    ):
        assert name in tensors, name
    config = json.loads((out / "config.json").read_text())
    assert config["image_sizes"] == [28, 28] and config["n_action_bins"] == 256
    assert config["text_config"]["vocab_size"] - config["pad_to_multiple_of"] == len(tokenizer)
    assert json.loads((out / "dataset_statistics.json").read_text())["config"]["action"]["q99"] == STATS["q99"]

    # The towers' features equal a timm-style forward over the published tensors.
    backbone = policy.vla.vision_backbone
    images = obs["images"][:, 0]
    for tower, prefix in ((backbone.featurizer, "vision_backbone.featurizer."),
                          (backbone.fused_featurizer, "vision_backbone.fused_featurizer.")):  # fmt: skip
        pixels = tower.preprocess(images)
        with torch.no_grad():
            expected = timm_vit_patches(tensors, prefix, pixels, tower.config.num_heads, tower.config.family)
            torch.testing.assert_close(tower(pixels), expected, rtol=1e-5, atol=1e-5)

    loaded = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="config", gripper_postprocess="libero"))
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(5))
    loaded_actions, loaded_log_probs = loaded.sample_actions(obs, generator=torch.Generator().manual_seed(5))
    assert torch.equal(actions, loaded_actions) and torch.equal(log_probs, loaded_log_probs)
    bins = policy.action_tokenizer.bins_from_actions(actions[:, 0])
    assert torch.equal(policy._bin_logits(obs, bins)[0], loaded._bin_logits(obs, bins)[0])
    assert torch.equal(loaded.env_actions(actions), policy.env_actions(actions))
    assert torch.equal(loaded.encode_instructions(INSTRUCTIONS)[0], obs["input_ids"])


def test_the_towers_resize_as_openvlas_processor_and_once_for_both(policy, monkeypatch):
    """Each tower's pixels are OpenVLA's processor's: PIL's bicubic resize of the 8-bit image (at
    most 2 of 255 away here), then ``(x / 255 - mean) / std``; the fused backbone resizes the
    frames once for its two towers of the same size."""
    import policies.openvla.modeling_prismatic as prismatic

    backbone = policy.vla.vision_backbone
    images = torch.randint(0, 256, (3, 40, 36, 3), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    for tower in (backbone.featurizer, backbone.fused_featurizer):
        size = tower.config.image_size
        resized = np.stack([np.asarray(Image.fromarray(image).resize((size, size), resample=Image.BICUBIC))
                            for image in images.numpy()])
        expected = (torch.from_numpy(resized).permute(0, 3, 1, 2).float() / 255 - tower.mean) / tower.std
        difference = (tower.preprocess(images) - expected).abs() * tower.std * 255  # in units of 1/255
        assert difference.max() <= 2 + 1e-3 and difference.mean() < 0.15
    calls = []
    monkeypatch.setattr(prismatic, "resize_uint8", lambda *args: calls.append(args[1:]) or resize_uint8(*args))
    with torch.no_grad():
        backbone(images)
    assert calls == [(28, 28, "bicubic")]


def test_a_checkpoint_is_loaded_into_parameters_built_on_the_meta_device(policy, obs, tmp_path, monkeypatch):
    """No random float32 initialisation before loading (7.5 B parameters: 30 GB of host memory
    per worker): the VLA is built with its parameters on ``meta`` and the checkpoint's tensors
    become them; the parameters checkpoints never hold (the towers' mask tokens) become zeros;
    allow_partial_load still builds everything (what the checkpoint lacks keeps its initialisation)."""
    from policies.openvla import policy_base

    out = policy.save_pretrained(tmp_path / "ckpt")
    built_on = []

    class Recorded(policy_base.PrismaticVLM):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built_on.append({parameter.device.type for parameter in self.parameters()})

    monkeypatch.setattr(policy_base, "PrismaticVLM", Recorded)
    loaded = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="config"))
    assert built_on == [{"meta"}] and not any(p.is_meta for p in loaded.vla.parameters())
    unused = {name: p for name, p in loaded.vla.named_parameters() if name.endswith("mask_token")}
    assert unused and all(not p.any() for p in unused.values())
    # the same weights as copying the checkpoint into a built model (allow_partial_load's way)
    copied = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="config", allow_partial_load=True))
    assert built_on[-1] == {"cpu"}
    for name, tensor in copied.vla.state_dict().items():
        if name not in unused:
            assert torch.equal(loaded.vla.state_dict()[name], tensor), name
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(5))
    assert torch.equal(loaded.sample_actions(obs, generator=torch.Generator().manual_seed(5))[1], log_probs)


def test_sharded_checkpoints_load(policy, obs, tmp_path):
    out = policy.save_pretrained(tmp_path / "sharded")
    assert not (out / "model.safetensors.index.json").exists()
    sharded = write_checkpoint(
        policy.vla.state_dict(), policy.architecture, tmp_path / "shards", policy.norm_stats, "dinosiglip-vit-so-224px",
        max_shard_size=200_000,
    )  # fmt: skip
    assert len(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    loaded = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(sharded)))
    actions, _ = policy.sample_actions(obs, greedy=True)
    assert torch.equal(policy.log_prob_and_entropy(obs, actions)[0], loaded.log_prob_and_entropy(obs, actions)[0])
    with pytest.raises(FileExistsError):
        policy.save_pretrained(out)
    with pytest.raises(FileNotFoundError, match="config.json"):
        OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(tmp_path / "missing")))


def test_lora_trains_only_the_adapters(tokenizer, obs):
    policy = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=False)))
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(6))
    trainable = policy.apply_lora(rank=4)
    assert trainable and all("lora_" in name for name in trainable)
    assert any(name.startswith("vla.language_model.") for name in trainable)
    recomputed, _ = policy.log_prob_and_entropy(obs, actions)  # B = 0 at init: same model
    torch.testing.assert_close(recomputed, log_probs, rtol=0, atol=1e-5)
    (-recomputed.mean()).backward()
    for name, parameter in policy.named_parameters():
        if "lora_" in name:
            assert parameter.requires_grad
        else:
            assert not parameter.requires_grad and parameter.grad is None, name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for n, p in policy.named_parameters() if "lora_B" in n)
    with pytest.raises(ValueError, match="LoRA"):
        policy.save_pretrained("/nonexistent/never")


def test_merged_lora_saves_and_reloads_the_adapted_model(tokenizer, obs, tmp_path):
    policy = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=False)))
    policy.apply_lora(rank=4)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(std=0.05)  # a trained adapter
    actions, _ = policy.sample_actions(obs, generator=torch.Generator().manual_seed(7))
    adapted, _ = policy.log_prob_and_entropy(obs, actions)
    assert policy.merge_lora() > 0
    assert not any("lora_" in name for name in policy.state_dict())
    torch.testing.assert_close(policy.log_prob_and_entropy(obs, actions)[0], adapted, rtol=0, atol=1e-4)
    loaded = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(policy.save_pretrained(tmp_path / "merged"))))
    assert torch.equal(loaded.log_prob_and_entropy(obs, actions)[0], policy.log_prob_and_entropy(obs, actions)[0])


def test_published_config_fields_give_the_openvla_7b_sizes():
    config = {
        "vision_backbone_id": "dinosiglip-vit-so-224px",
        "image_sizes": [224, 224],
        "text_config": {"model_type": "llama", "pad_token_id": 32000, "vocab_size": 32064},
        "pad_to_multiple_of": 64,
        "n_action_bins": 256,
    }
    architecture = architecture_from_config(config, "config.json")
    assert architecture.action_vocab_end == 32000 and architecture.num_patches == 256
    dino, siglip = architecture.vision_towers
    assert (dino.family, dino.hidden_size, dino.num_layers, dino.num_register_tokens) == ("dinov2", 1024, 24, 4)
    assert (siglip.family, siglip.hidden_size, siglip.num_layers, siglip.intermediate_size) == ("siglip", 1152, 27, 4304)
    assert architecture.text_config["hidden_size"] == 4096 and architecture.text_config["num_hidden_layers"] == 32
    with pytest.raises(ValueError, match="vision_backbone_id"):
        architecture_from_config({**config, "vision_backbone_id": "clip-vit-l"}, "config.json")


def test_bfloat16_parameters_keep_float32_log_probs_and_a_ratio_near_one(tokenizer, obs):
    config = OpenVLAPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=False), dtype="bfloat16")
    policy = OpenVLAPolicy(config)
    actions, log_probs = policy.sample_actions(obs, generator=torch.Generator().manual_seed(8))
    assert log_probs.dtype == torch.float32 and actions.dtype == torch.float32
    ratio = torch.exp(policy.log_prob_and_entropy(obs, actions)[0] - log_probs)
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=0.05)  # bf16 cached vs uncached


def test_a_bfloat16_policy_keeps_its_buffers_in_float32(tokenizer):
    """``dtype: bfloat16`` casts the parameters only, as transformers builds a model in a dtype: the
    rotary frequencies and the towers' image mean/std are the float32 model's (in bfloat16 the
    rotary angle at OpenVLA's prefix end, position 280, is off by 0.34 rad, and the DINOv2 mean
    0.485 becomes 0.484375)."""
    architecture = tiny_architecture(len(tokenizer))
    full = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=architecture))
    half = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=architecture, dtype="bfloat16"))
    assert {p.dtype for p in half.vla.parameters() if p.is_floating_point()} == {torch.bfloat16}
    buffers = dict(full.vla.named_buffers())
    assert any(name.endswith("inv_freq") for name in buffers) and any(name.endswith(".mean") for name in buffers)
    for name, buffer in half.vla.named_buffers():
        assert buffer.dtype == buffers[name].dtype and torch.equal(buffer, buffers[name]), name


def test_a_checkpoint_cast_to_another_dtype_is_not_held_twice(policy, tmp_path, monkeypatch):
    """A bfloat16 checkpoint loaded as float32: when the parameters are cast, nothing but the
    parameters holds the checkpoint's tensors, so each is freed as its cast replaces it (7.5 B:
    15 GB of bfloat16 beside the 30 GB of float32 otherwise)."""
    import weakref

    from policies.openvla import policy_base

    half = {name: tensor.to(torch.bfloat16) if tensor.is_floating_point() else tensor
            for name, tensor in policy.vla.state_dict().items()}
    out = write_checkpoint(half, policy.architecture, tmp_path / "bf16", policy.norm_stats, "dinosiglip-vit-so-224px")
    read, held_at_cast = policy_base.read_checkpoint, []

    def reading(*args, **kwargs):
        architecture, weights, norm_stats = read(*args, **kwargs)
        read_tensors.extend(weakref.ref(tensor) for tensor in weights.values())
        return architecture, weights, norm_stats

    def casting(module, dtype):
        held_at_cast.append(sum(ref() is not None for ref in read_tensors))
        policy_base_cast(module, dtype)

    read_tensors: list[weakref.ref] = []
    policy_base_cast = policy_base.cast_parameters
    monkeypatch.setattr(policy_base, "read_checkpoint", reading)
    monkeypatch.setattr(policy_base, "cast_parameters", casting)
    loaded = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="config"))
    assert read_tensors and held_at_cast == [0]
    assert {p.dtype for p in loaded.vla.parameters() if p.is_floating_point()} == {torch.float32}
    as_stored = OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="config", dtype="bfloat16"))
    for name, tensor in loaded.vla.state_dict().items():
        assert torch.equal(tensor, as_stored.vla.state_dict()[name].float()), name


def test_architecture_presets_and_cameras_are_validated():
    from policies.openvla_oft import OpenVLAOFTPolicyConfig

    assert OpenVLAPolicyConfig(architecture="tiny").architecture == {"preset": "tiny"}
    assert OpenVLAPolicyConfig(architecture="tiny").cameras == ("agentview",)
    assert OpenVLAOFTPolicyConfig(architecture="tiny", num_images=2).cameras == ("agentview", "robot0_eye_in_hand")
    assert OpenVLAOFTPolicyConfig(architecture="tiny", cameras=["wrist"]).cameras == ("wrist",)  # YAML list
    with pytest.raises(ValueError, match="preset 'huge'"):
        OpenVLAPolicyConfig(architecture="huge")
    with pytest.raises(ValueError, match="no options"):
        OpenVLAPolicyConfig(architecture={"preset": "tiny", "depth": 3})
    with pytest.raises(ValueError, match="cameras"):
        OpenVLAOFTPolicyConfig(architecture="tiny", num_images=2, cameras=["agentview"])
    with pytest.raises(ValueError, match="cameras"):
        OpenVLAPolicyConfig(architecture="tiny", cameras=["agentview", "robot0_eye_in_hand"])


def test_tiny_preset_reads_simulator_observations_with_its_own_tokenizer():
    from vla_rl_core.observations import encode_instruction

    policy = OpenVLAPolicy(OpenVLAPolicyConfig(architecture={"preset": "tiny", "image_size": 28, "fused": False}))
    assert policy.vla.vision_backbone.fused_featurizer is None  # DINOv2 alone
    codes = torch.from_numpy(np.stack([encode_instruction("lift the cube"), encode_instruction("open the door")]))
    images = torch.randint(0, 256, (2, 16, 16, 3), dtype=torch.uint8)
    raw = TensorDict({"agentview_image": images, "instruction": codes}, batch_size=[2])
    inputs = policy.model_inputs(raw)
    expected_ids, expected_mask = policy.encode_instructions(["lift the cube", "open the door"])
    assert torch.equal(inputs["input_ids"], expected_ids) and torch.equal(inputs["attention_mask"], expected_mask)
    assert torch.equal(inputs["images"][:, 0], images)
    assert policy.model_inputs(inputs) is inputs  # model inputs pass through
    actions, log_probs = policy.sample_actions(raw, greedy=True)
    assert torch.equal(policy.sample_actions(inputs, greedy=True)[0], actions)


@pytest.mark.parametrize("fused, expected", [(True, "dinosiglip-vit-so-224px"), (False, "dinov2-vit-l")])
def test_the_published_backbone_id_recorded_is_the_one_of_the_towers(tokenizer, tmp_path, fused, expected):
    # A single-tower model was recorded as "dinosiglip-vit-so-224px" beside use_fused_vision_backbone
    # false: a reader of the published fields built two towers.
    policy = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=tiny_architecture(len(tokenizer), fused=fused)))
    config = json.loads((policy.save_pretrained(tmp_path / "ckpt") / "config.json").read_text())
    assert (config["vision_backbone_id"], config["use_fused_vision_backbone"]) == (expected, fused)
    published = {key: value for key, value in config.items() if key != "vla_rl_vision_towers"}
    towers = architecture_from_config(published, "config.json").vision_towers
    assert [tower.family for tower in towers] == [tower.family for tower in policy.architecture.vision_towers]
    other = "dinov2-vit-l" if fused else "dinosiglip-vit-so-224px"
    with pytest.raises(ValueError, match=f"vision_backbone_id '{other}' is not one of the published ids of towers"):
        policy.save_pretrained(tmp_path / "other", vision_backbone_id=other)
    assert not (tmp_path / "other").exists()


def test_an_unnorm_key_for_a_checkpoint_without_statistics_is_refused(tokenizer, tmp_path):
    # It was ignored: actions went to the simulator normalised, as if no key had been set.
    policy = OpenVLAPolicy(OpenVLAPolicyConfig(architecture=tiny_architecture(len(tokenizer))))
    policy.tokenizer = tokenizer
    out = policy.save_pretrained(tmp_path / "ckpt")
    assert OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out))).action_statistics is None
    with pytest.raises(ValueError, match=r"ckpt/dataset_statistics.json: holds no action statistics, so unnorm_key "
                                         r"'bridge' names none; unset policy.config.unnorm_key"):
        OpenVLAPolicy(OpenVLAPolicyConfig(model_path=str(out), unnorm_key="bridge"))
