"""The π0 model on a tiny in-process config: shapes, the block-causal attention mask, the time
embedding, the flow-matching loss and the Euler sampler against hand computations, the prefix
KV-cache against the joint forward pass, checkpoints in the published layouts (round trip, and read
by transformers' own PI0 implementation), and the full-size parameter count on the meta device."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.checkpoint_files import read_safetensors_header
from policies.pi0.backbone_pi0 import attention_bias, gemma_config, paligemma_config
from policies.pi0.checkpoint_pi0 import (
    load_pi0_checkpoint,
    load_pi0_weights,
    read_checkpoint_config,
    save_pi0_checkpoint,
)
from policies.pi0.configuration_pi0 import (
    PI0ModelConfig,
    pi0_model_preset,
    tiny_pi0_config,
)
from policies.pi0.modeling_pi0 import (
    PI0Inputs,
    PI0Model,
    make_att_2d_masks,
    ode_times,
    sinusoidal_time_embedding,
)

BATCH, CAMERAS = 2, 2


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@pytest.fixture(scope="module")
def config() -> PI0ModelConfig:
    return tiny_pi0_config()


@pytest.fixture(scope="module")
def model(config) -> PI0Model:
    torch.manual_seed(0)
    return PI0Model(config).eval()


def make_inputs(config: PI0ModelConfig, seed: int = 0, padded: bool = True) -> PI0Inputs:
    """Random inputs; with ``padded``, row 1 lacks its second camera and its last 3 prompt tokens."""
    generator = torch.Generator().manual_seed(seed)
    side, length = config.vision.image_size, config.tokenizer_max_length
    image_masks = torch.ones(BATCH, CAMERAS, dtype=torch.bool)
    lang_masks = torch.ones(BATCH, length, dtype=torch.bool)
    if padded:
        image_masks[1, 1] = False
        lang_masks[1, -3:] = False
    return PI0Inputs(
        images=torch.rand(BATCH, CAMERAS, 3, side, side, generator=generator) * 2 - 1,
        image_masks=image_masks,
        lang_tokens=torch.randint(0, config.vocab_size, (BATCH, length), generator=generator),
        lang_masks=lang_masks,
        state=torch.randn(BATCH, config.max_state_dim, generator=generator),
    )


def chunk(config: PI0ModelConfig, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(BATCH, config.chunk_size, config.max_action_dim, generator=generator)


def test_tiny_forward_shapes(model, config):
    inputs = make_inputs(config)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000
    prefix_len = CAMERAS * config.num_image_tokens + config.tokenizer_max_length
    embs, pad, att = model.embed_prefix(inputs.images, inputs.image_masks, inputs.lang_tokens, inputs.lang_masks)
    assert embs.shape == (BATCH, prefix_len, config.vlm.width) and pad.shape == att.shape == (BATCH, prefix_len)
    suffix, suffix_pad, suffix_att = model.embed_suffix(inputs.state, chunk(config, 1), torch.rand(BATCH))
    assert suffix.shape == (BATCH, 1 + config.chunk_size, config.expert.width)
    assert suffix_pad.all() and suffix_att.tolist() == [[True, True] + [False] * (config.chunk_size - 1)] * BATCH
    with torch.no_grad():
        cache = model.prefix_cache(inputs)
        velocity = model.velocity(cache, chunk(config, 1), 0.5, inputs.state)
    assert len(cache.keys) == len(cache.values) == config.vlm.depth
    assert cache.keys[0].shape == (BATCH, config.vlm.num_kv_heads, prefix_len, config.vlm.head_dim)
    assert velocity.shape == (BATCH, config.chunk_size, config.max_action_dim) and velocity.dtype == torch.float32
    loss = model.flow_matching_loss(inputs, chunk(config, 2), generator=torch.Generator().manual_seed(0))
    assert loss.shape == velocity.shape
    loss.mean().backward()
    assert model.action_in_proj.weight.grad is not None and model.paligemma_with_expert.vlm.layers[0].mlp.up_proj.weight.grad is not None
    model.zero_grad(set_to_none=True)
    actions = model.sample_actions_ode(inputs, generator=torch.Generator().manual_seed(0))
    assert actions.shape == velocity.shape


def test_make_att_2d_masks_small_hand_example():
    # prefix of 3 tokens (the 3rd padded), then the state, then 2 actions
    pad = torch.tensor([[1, 1, 0, 1, 1, 1]], dtype=torch.bool)
    att = torch.tensor([[0, 0, 0, 1, 1, 0]], dtype=torch.bool)
    expected = torch.tensor([
        # keys: p0 p1 p2 st a0 a1
        [1, 1, 0, 0, 0, 0],  # p0
        [1, 1, 0, 0, 0, 0],  # p1
        [0, 0, 0, 0, 0, 0],  # p2 (padding)
        [1, 1, 0, 1, 0, 0],  # state
        [1, 1, 0, 1, 1, 1],  # a0
        [1, 1, 0, 1, 1, 1],  # a1
    ], dtype=torch.bool)
    assert torch.equal(make_att_2d_masks(pad, att)[0], expected)


def test_model_attention_mask_is_openpi_block_causal(model, config):
    inputs = make_inputs(config)
    _, prefix_pad, prefix_att = model.embed_prefix(inputs.images, inputs.image_masks, inputs.lang_tokens,
                                                   inputs.lang_masks)
    _, suffix_pad, suffix_att = model.embed_suffix(inputs.state, chunk(config, 1), torch.rand(BATCH))
    allowed = make_att_2d_masks(torch.cat([prefix_pad, suffix_pad], 1), torch.cat([prefix_att, suffix_att], 1))
    patches, length = config.num_image_tokens, config.tokenizer_max_length
    prefix_len = CAMERAS * patches + length
    total = prefix_len + 1 + config.chunk_size
    for row in range(BATCH):
        real = [bool(inputs.image_masks[row, position // patches]) for position in range(CAMERAS * patches)]
        real += [bool(inputs.lang_masks[row, position]) for position in range(length)]
        real += [True] * (1 + config.chunk_size)
        kind = ["prefix"] * prefix_len + ["state"] + ["action"] * config.chunk_size
        sees = {"prefix": {"prefix"}, "state": {"prefix", "state"}, "action": {"prefix", "state", "action"}}
        expected = torch.tensor([[real[q] and real[k] and kind[k] in sees[kind[q]] for k in range(total)]
                                 for q in range(total)])
        assert torch.equal(allowed[row], expected)
    assert not real[CAMERAS * patches - 1] and not real[prefix_len - 1]  # the padding is exercised (row 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_fully_masked_query_row_gets_a_uniform_softmax_in_every_dtype(dtype):
    # the padded token's row masks every key (make_att_2d_masks); openpi's finite bias makes its
    # softmax uniform, where -inf (the float32 bias rounded to float16) would make it NaN
    allowed = torch.tensor([[[True, True, False], [False, False, False]]])
    bias = attention_bias(allowed, dtype)
    assert bias.dtype == dtype and torch.isfinite(bias).all()
    scores = torch.tensor([[[[0.5, -1.0, 2.0], [0.5, -1.0, 2.0]]]], dtype=dtype)
    probs = torch.softmax((scores + bias).float(), dim=-1)[0, 0]
    assert torch.equal(probs[1], torch.full((3,), 1 / 3))
    assert probs[0, 2] == 0 and torch.allclose(probs[0, :2], torch.softmax(torch.tensor([0.5, -1.0]), -1), atol=1e-3)


def test_time_embedding_matches_hand_computation():
    time = torch.tensor([0.0, 0.37, 1.0])
    dimension = 6
    periods = [4e-3 * (4.0 / 4e-3) ** (i / 2) for i in range(3)]  # linspace(0, 1, 3)
    expected = torch.tensor([[math.sin(2 * math.pi * t / p) for p in periods]
                             + [math.cos(2 * math.pi * t / p) for p in periods] for t in time.tolist()])
    got = sinusoidal_time_embedding(time, dimension, 4e-3, 4.0)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_flow_matching_loss_matches_hand_computation(model, config):
    inputs = make_inputs(config)
    actions, noise = chunk(config, 3), chunk(config, 4)
    time = torch.tensor([0.25, 0.9])
    x_t = torch.stack([0.25 * noise[0] + 0.75 * actions[0], 0.9 * noise[1] + 0.1 * actions[1]])
    with torch.no_grad():
        expected = (noise - actions - model.velocity_uncached(inputs, x_t, time)) ** 2
        loss = model.flow_matching_loss(inputs, actions, noise=noise, time=time)
    torch.testing.assert_close(loss, expected, atol=1e-6, rtol=1e-6)


def test_sample_time_is_scaled_beta(model):
    times = model.sample_time(20_000, torch.Generator().manual_seed(0), "cpu")
    assert times.shape == (20_000,) and times.min() >= 0.001 and times.max() <= 1.0
    beta = (times - 0.001) / 0.999
    assert abs(beta.mean().item() - 1.5 / 2.5) < 0.01  # Beta(1.5, 1) mean
    assert abs((beta <= 0.5).float().mean().item() - 0.5 ** 1.5) < 0.01  # its CDF x ** 1.5


def test_ode_sampler_is_euler_from_one_to_zero(model, config):
    inputs, noise = make_inputs(config), chunk(config, 5)
    with torch.no_grad():
        cache = model.prefix_cache(inputs)
        one_step = model.sample_actions_ode(inputs, noise=noise, num_steps=1)
        torch.testing.assert_close(one_step, noise - model.velocity(cache, noise, 1.0, inputs.state))
        half = noise - 0.5 * model.velocity(cache, noise, 1.0, inputs.state)
        expected = half - 0.5 * model.velocity(cache, half, 0.5, inputs.state)
        torch.testing.assert_close(model.sample_actions_ode(inputs, noise=noise, num_steps=2), expected)
    openpi_times, time = [], torch.tensor(1.0)
    dt = torch.tensor(-1.0 / 10)
    while time >= -dt / 2:  # openpi's sample_actions loop
        openpi_times.append(time.clone())
        time += dt
    assert torch.equal(ode_times(10), torch.stack(openpi_times))


def test_prefix_cache_velocity_equals_uncached_forward(model, config):
    inputs, x_t, time = make_inputs(config), chunk(config, 6), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        cache = model.prefix_cache(inputs)
        cached = model.velocity(cache, x_t, time, inputs.state)
        torch.testing.assert_close(cached, model.velocity_uncached(inputs, x_t, time), atol=1e-5, rtol=1e-5)
        assert torch.equal(model.velocity(cache, x_t, time, inputs.state), cached)  # the cache is not modified
        # the velocity reads the real prefix tokens and ignores the padded ones (row 1)
        changed = make_inputs(config)
        changed.lang_tokens[1, -1] = (changed.lang_tokens[1, -1] + 1) % config.vocab_size
        changed.images[1, 1] = -changed.images[1, 1]
        torch.testing.assert_close(model.velocity(model.prefix_cache(changed), x_t, time, inputs.state), cached)
        changed.lang_tokens[1, 0] = (changed.lang_tokens[1, 0] + 1) % config.vocab_size
        moved = model.velocity(model.prefix_cache(changed), x_t, time, inputs.state)
        assert torch.equal(moved[0], cached[0]) and not torch.allclose(moved[1], cached[1])


@pytest.mark.parametrize("layout", ["lerobot", "openpi"])
def test_checkpoint_round_trip(model, config, layout, tmp_path):
    directory = save_pi0_checkpoint(model, tmp_path / "ckpt", layout=layout)
    names = set(read_safetensors_header(directory / "model.safetensors"))
    prefix = "model." if layout == "lerobot" else ""
    for name in ("paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
                 "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.self_attn.out_proj.bias",
                 "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight",
                 "paligemma_with_expert.paligemma.model.language_model.layers.1.self_attn.q_proj.weight",
                 "paligemma_with_expert.paligemma.model.language_model.norm.weight",
                 "paligemma_with_expert.paligemma.lm_head.weight",
                 "paligemma_with_expert.gemma_expert.model.layers.1.mlp.down_proj.weight",
                 "paligemma_with_expert.gemma_expert.model.norm.weight",
                 "paligemma_with_expert.gemma_expert.lm_head.weight",
                 "state_proj.weight", "action_in_proj.bias", "action_time_mlp_in.weight", "action_time_mlp_out.bias",
                 "action_out_proj.weight"):
        assert prefix + name in names
    assert not any("embed_tokens" in name for name in names)  # tied: stored once, as lm_head (save_model's choice)
    assert read_checkpoint_config(directory) == config
    torch.manual_seed(1)
    loaded = load_pi0_checkpoint(directory).eval()
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    inputs, x_t = make_inputs(config), chunk(config, 7)
    with torch.no_grad():
        assert torch.equal(loaded.velocity_uncached(inputs, x_t, 0.4), model.velocity_uncached(inputs, x_t, 0.4))
        noise = chunk(config, 8)
        assert torch.equal(loaded.sample_actions_ode(inputs, noise=noise), model.sample_actions_ode(inputs, noise=noise))


def test_a_checkpoint_is_loaded_into_parameters_built_on_the_meta_device(model, config, tmp_path, monkeypatch):
    """No random float32 initialisation before loading (3.2 B parameters: 13 GB of host memory per
    worker): the model is built with its parameters on ``meta`` and the checkpoint's tensors,
    cast once to the requested dtype, become them."""
    from policies.pi0 import checkpoint_pi0

    directory = save_pi0_checkpoint(model, tmp_path / "ckpt")
    built_on = []

    class Recorded(checkpoint_pi0.PI0Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built_on.append({parameter.device.type for parameter in self.parameters()})

    monkeypatch.setattr(checkpoint_pi0, "PI0Model", Recorded)
    loaded = load_pi0_checkpoint(directory, dtype=torch.bfloat16)
    assert built_on == [{"meta"}]
    dtypes = model.parameter_dtypes(torch.bfloat16)  # openpi's: see test_bfloat16_takes_openpis_dtypes
    assert {p.device.type for p in loaded.parameters()} == {"cpu"}
    assert {name: p.dtype for name, p in loaded.named_parameters()} == dtypes
    for name, tensor in model.named_parameters():
        assert torch.equal(loaded.state_dict()[name], tensor.detach().to(dtypes[name])), name


def test_bfloat16_takes_openpis_dtypes(model):
    """openpi's ``to_bfloat16_for_selected_params`` casts the backbone to bfloat16 but for SigLIP's
    patch and position embeddings and the RMSNorm weights; the flow-matching projections, built
    after it, stay float32."""
    dtypes = model.parameter_dtypes(torch.bfloat16)
    kept = {name for name, dtype in dtypes.items() if dtype == torch.float32}
    backbone = "paligemma_with_expert."
    assert {name for name in kept if not name.startswith(backbone)} == {
        f"{projection}.{field}" for projection in ("state_proj", "action_in_proj", "action_time_mlp_in",
                                                   "action_time_mlp_out", "action_out_proj")
        for field in ("weight", "bias")}
    inside = {name.removeprefix(backbone) for name in kept if name.startswith(backbone)}
    assert {"paligemma.model.vision_tower.embeddings.patch_embedding.weight",
            "paligemma.model.vision_tower.embeddings.patch_embedding.bias",
            "paligemma.model.vision_tower.embeddings.position_embedding.weight",
            "paligemma.model.language_model.norm.weight", "gemma_expert.model.norm.weight"} <= inside
    norms = {name for name in inside if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight"))}
    assert len(norms) == 2 * 2 * model.config.vlm.depth and len(inside) == 3 + 2 + len(norms)
    assert all(dtypes[name] == torch.bfloat16 for name in dtypes if name not in kept)
    assert model.parameter_dtypes(torch.float32) == {name: torch.float32 for name in dtypes}


def test_a_checkpoint_loaded_in_bfloat16_keeps_float32_rotary_frequencies(model, tmp_path):
    """``dtype`` casts the parameters, not the buffers: openpi's JAX π0 computes its rotary
    angles in float32, and the bfloat16-rounded frequencies put the angle at position 816 (the end
    of a 3-camera prefix, head dim 256) off by 1.13 rad."""
    loaded = load_pi0_checkpoint(save_pi0_checkpoint(model, tmp_path / "ckpt"), dtype=torch.bfloat16)
    buffers = dict(model.named_buffers())
    assert any(name.endswith("rotary_emb.inv_freq") for name in buffers)
    for name, buffer in loaded.named_buffers():
        assert buffer.dtype == buffers[name].dtype and torch.equal(buffer, buffers[name]), name


def test_checkpoint_errors_name_the_file_and_the_tensors(model, config, tmp_path):
    directory = save_pi0_checkpoint(model, tmp_path / "ckpt")
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.action_out_proj.bias"]
    tensors["model.value_head.weight"] = torch.zeros(1)
    tensors["model.state_proj.weight"] = torch.zeros(3, 3)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(ValueError) as error:
        load_pi0_weights(PI0Model(config), directory)
    message = str(error.value)
    assert str(directory / "model.safetensors") in message
    assert "1 missing (model.action_out_proj.bias)" in message and "1 unexpected (model.value_head.weight)" in message
    assert "model.state_proj.weight: (3, 3) in the checkpoint" in message


def test_published_configs_give_the_full_size_architecture(tmp_path):
    lerobot = tmp_path / "lerobot"
    lerobot.mkdir()
    (lerobot / "config.json").write_text(json.dumps({
        "type": "pi0", "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m", "chunk_size": 50,
        "max_state_dim": 32, "max_action_dim": 32, "num_inference_steps": 10, "tokenizer_max_length": 48,
        "image_resolution": [224, 224], "time_sampling_beta_alpha": 1.5, "time_sampling_beta_beta": 1.0}))
    assert read_checkpoint_config(lerobot) == pi0_model_preset("pi0")
    openpi = tmp_path / "openpi"
    openpi.mkdir()
    (openpi / "config.json").write_text(json.dumps({
        "action_dim": 32, "action_horizon": 10, "paligemma_variant": "gemma_2b",
        "action_expert_variant": "gemma_300m", "precision": "bfloat16"}))
    assert read_checkpoint_config(openpi) == pi0_model_preset("pi0", chunk_size=10)
    # openpi's low-memory (LoRA) fine-tuning configs name the same sizes with a _lora suffix
    (openpi / "config.json").write_text(json.dumps({
        "action_dim": 32, "action_horizon": 10, "paligemma_variant": "gemma_2b_lora",
        "action_expert_variant": "gemma_300m_lora", "precision": "bfloat16"}))
    assert read_checkpoint_config(openpi) == pi0_model_preset("pi0", chunk_size=10)


def transformers_reads_lerobot_pi0() -> bool:
    """Whether the installed transformers' ``pi0`` conversion mapping strips the ``model.`` prefix
    of LeRobot's names (``model.paligemma_with_expert...``). transformers 5.17-5.22 lack that rule
    (5.23 has it), so their PI0 loads none of a LeRobot checkpoint's weights, the hub's included:
    every tensor is reported missing and initialised at random."""
    from transformers.conversion_mapping import get_checkpoint_conversion_mapping

    return any(getattr(rule, "prefix_to_remove", None) == "model"
               for rule in get_checkpoint_conversion_mapping("pi0") or [])


def test_transformers_pi0_reads_our_checkpoint_and_agrees(model, config, tmp_path):
    """transformers' own PI0 (``transformers/models/pi0``, which maps the hub's LeRobot names onto
    its modules by its ``pi0`` conversion mapping) loads our LeRobot-layout file and predicts the
    same velocities: an independent check of the layout and of the maths."""
    import transformers
    from transformers import PI0Config, PI0ForConditionalGeneration

    if not transformers_reads_lerobot_pi0():
        pytest.skip(f"transformers {transformers.__version__}'s PI0 cannot read LeRobot's pi0 names (its pi0 "
                    "conversion mapping keeps their 'model.' prefix; fixed in 5.23)")

    directory = save_pi0_checkpoint(model, tmp_path / "ckpt", layout="lerobot")
    hf_config = PI0Config(vlm_config=paligemma_config(config).to_dict(),
                          dit_config=gemma_config(config.expert, config.vocab_size).to_dict(),
                          chunk_size=config.chunk_size, max_state_dim=config.max_state_dim,
                          max_action_dim=config.max_action_dim)
    hf_config.save_pretrained(directory)
    reference, loading = PI0ForConditionalGeneration.from_pretrained(directory, dtype=torch.float32,
                                                                     output_loading_info=True)
    assert not loading["missing_keys"] and not loading["unexpected_keys"], loading
    reference.eval()
    inputs = make_inputs(config, padded=False)
    inputs.lang_masks[1, -3:] = False
    image_tokens = torch.full((BATCH, CAMERAS * config.num_image_tokens), config.vocab_size)
    x_t, time = chunk(config, 9), torch.tensor([0.3, 0.8])
    with torch.no_grad():
        reference_velocity = reference(
            state=inputs.state, noise=x_t, timestep=time, input_ids=torch.cat([image_tokens, inputs.lang_tokens], 1),
            pixel_values=inputs.images, pixel_attention_mask=inputs.image_masks,
            attention_mask=torch.cat([torch.ones_like(image_tokens), inputs.lang_masks.long()], 1),
        ).logits
        ours = model.velocity(model.prefix_cache(inputs), x_t, time, inputs.state)
    torch.testing.assert_close(ours, reference_velocity, atol=1e-4, rtol=1e-4)


def test_full_size_parameter_count_on_meta_device():
    config = pi0_model_preset("pi0")
    with torch.device("meta"):
        model = PI0Model(config)
    count = sum(p.numel() for p in model.parameters())
    vision = (3 * 14 * 14 * 1152 + 1152) + 256 * 1152 + 27 * (4 * (1152 * 1152 + 1152) + 2 * 2 * 1152
                                                             + 1152 * 4304 + 4304 + 4304 * 1152 + 1152) + 2 * 1152
    projector = 1152 * 2048 + 2048

    def gemma(width: int, mlp: int) -> int:  # q, k, v, o (8 heads, 1 kv head of 256), gated MLP, 2 norms
        return 18 * (width * 2048 + 2 * width * 256 + 2048 * width + 3 * width * mlp + 2 * width) + width

    embeddings = 257_152 * 2048
    projections = (32 * 1024 + 1024) * 2 + (1024 * 32 + 32) + (2048 * 1024 + 1024) + (1024 * 1024 + 1024)
    expected = vision + projector + embeddings + gemma(2048, 16_384) + gemma(1024, 4096) + projections
    assert count == expected
    assert 3.2e9 < count < 3.3e9  # "3.3 billion" in the paper: PaliGemma 3B + the 300M expert (311M)
    assert sum(p.numel() for p in model.paligemma_with_expert.gemma_expert.parameters()) == 311_464_960


def test_bfloat16_backbone_gives_float32_velocities(config):
    torch.manual_seed(0)
    model = PI0Model(config).eval()
    inputs, x_t = make_inputs(config), chunk(config, 10)
    with torch.no_grad():
        full_precision = model.velocity(model.prefix_cache(inputs), x_t, 0.5, inputs.state)
        model.cast_parameters(torch.bfloat16)  # openpi's dtypes: float32 SigLIP embeddings into bfloat16 layers
        cached = model.velocity(model.prefix_cache(inputs), x_t, 0.5, inputs.state)
        uncached = model.velocity_uncached(inputs, x_t, 0.5)
    assert cached.dtype == torch.float32 and model.action_out_proj.weight.dtype == torch.float32
    torch.testing.assert_close(cached, uncached)
    torch.testing.assert_close(cached, full_precision, atol=0.05, rtol=0.05)
