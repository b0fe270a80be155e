"""The π0 backbone: PaliGemma (SigLIP, projector, Gemma) and the Gemma action expert, attending
jointly in every layer.

Built from transformers' components (``PaliGemmaModel``, ``GemmaDecoderLayer``, ``GemmaRMSNorm``,
the Gemma rotary embedding), with module names laid out as openpi's ``PaliGemmaWithExpertModel``
(``src/openpi/models_pytorch/gemma_pytorch.py``) so that checkpoints map name for name
(:mod:`policies.pi0.checkpoint_pi0`). The layer loop follows openpi's ``compute_layer_complete``
(same file, ``PaliGemmaWithExpertModel.forward``): each stream (prefix: images + language through
the PaliGemma weights; suffix: state + actions through the expert's weights) is normalised and
projected with its own layer, the queries, keys and values of both streams are concatenated along
the sequence and attend together, and each stream's slice of the attention output goes through its
own output projection, residual, norm and MLP (π0 paper, arXiv 2410.24164, Sec. 3: "a single
transformer with two sets of weights").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import (
    GemmaConfig,
    PaliGemmaConfig,
    PaliGemmaModel,
    SiglipVisionConfig,
)
from transformers.models.gemma.modeling_gemma import (
    GemmaDecoderLayer,
    GemmaRMSNorm,
    apply_rotary_pos_emb,
)

from policies.pi0.configuration_pi0 import GemmaSpec, PI0ModelConfig

#: The callable attribute of each VLM decoder layer that runs its depth of the joint stack (both
#: streams' layers): what FSDP registers as the forward of the depth's unit.
JOINT_FORWARD = "joint_forward"

#: Additive attention bias of a masked pair (openpi ``_prepare_attention_masks_4d``): finite, so a
#: query row with every key masked (a padded token) gets a uniform softmax instead of NaN.
MASKED_BIAS = -2.3819763e38


@dataclass(frozen=True)
class PrefixCache:
    """Keys and values of the prefix (images + language) in every layer, computed once per
    observation (``PI0Model.prefix_cache``) and read, never written, by every
    denoising step (so a sampler may call the velocity any number of times).

    Attributes:
        keys, values: one tensor per layer, ``(batch, num_kv_heads, prefix_len, head_dim)``, keys
            after the rotary embedding.
        pad_mask: ``(batch, prefix_len)`` bool, True at real (non-padding) prefix tokens.
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    pad_mask: Tensor

    @property
    def num_valid(self) -> Tensor:
        """``(batch,)`` int64: real prefix tokens per row (the suffix's first position)."""
        return self.pad_mask.sum(dim=-1)


def gemma_config(spec: GemmaSpec, vocab_size: int) -> GemmaConfig:
    """The transformers ``GemmaConfig`` of a :class:`GemmaSpec` (tanh-approximated GELU, as openpi's
    ``hidden_activation="gelu_pytorch_tanh"``)."""
    return GemmaConfig(
        vocab_size=vocab_size,
        hidden_size=spec.width,
        intermediate_size=spec.mlp_dim,
        num_hidden_layers=spec.depth,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        head_dim=spec.head_dim,
        hidden_activation="gelu_pytorch_tanh",
        rms_norm_eps=spec.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        pad_token_id=0,
    )


def paligemma_config(config: PI0ModelConfig) -> PaliGemmaConfig:
    """The transformers ``PaliGemmaConfig`` of a π0 backbone (openpi ``PaliGemmaWithExpertModel``:
    no SigLIP pooling head, projection to the Gemma width, image token id = vocabulary size)."""
    vision = config.vision
    vision_config = SiglipVisionConfig(
        hidden_size=vision.hidden_size,
        intermediate_size=vision.intermediate_size,
        num_hidden_layers=vision.num_layers,
        num_attention_heads=vision.num_heads,
        image_size=vision.image_size,
        patch_size=vision.patch_size,
        layer_norm_eps=vision.layer_norm_eps,
        vision_use_head=False,
    )
    return PaliGemmaConfig(
        vision_config=vision_config,
        text_config=gemma_config(config.vlm, config.vocab_size),
        projection_dim=config.vlm.width,
        vocab_size=config.vocab_size,
        image_token_index=config.vocab_size,
    )


class _PaliGemma(nn.Module):
    """Holds transformers' ``PaliGemmaModel`` as ``model`` (openpi's ``paligemma.model``); the
    language head is not built: π0 never decodes text."""

    def __init__(self, config: PI0ModelConfig) -> None:
        super().__init__()
        self.model = PaliGemmaModel(paligemma_config(config))


class _ExpertStack(nn.Module):
    """The action expert's decoder layers and final norm (openpi's ``gemma_expert.model`` without
    token embeddings: the expert reads projected states and actions)."""

    def __init__(self, spec: GemmaSpec, vocab_size: int) -> None:
        super().__init__()
        hf_config = gemma_config(spec, vocab_size)
        self.layers = nn.ModuleList(GemmaDecoderLayer(hf_config, index) for index in range(spec.depth))
        self.norm = GemmaRMSNorm(spec.width, eps=spec.rms_norm_eps)


class _Expert(nn.Module):
    def __init__(self, spec: GemmaSpec, vocab_size: int) -> None:
        super().__init__()
        self.model = _ExpertStack(spec, vocab_size)


def attention_bias(allowed: Tensor, dtype: torch.dtype) -> Tensor:
    """``(batch, 1, queries, keys)`` additive bias of ``dtype``: 0 where ``allowed``
    (``(batch, queries, keys)`` bool), :data:`MASKED_BIAS` elsewhere, or ``dtype``'s lowest finite
    value where that is higher (float16's -65504: :data:`MASKED_BIAS` would round to -inf there, and
    a padded token's fully masked row to NaN)."""
    return torch.where(allowed[:, None], 0.0, max(MASKED_BIAS, torch.finfo(dtype).min)).to(dtype)


class PaliGemmaWithExpert(nn.Module):
    """PaliGemma and the action expert (openpi ``PaliGemmaWithExpertModel``).

    Submodules: ``paligemma.model`` (transformers ``PaliGemmaModel``: ``vision_tower``,
    ``multi_modal_projector``, ``language_model``) and ``gemma_expert.model`` (``layers``, ``norm``).
    """

    def __init__(self, config: PI0ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.paligemma = _PaliGemma(config)
        self.gemma_expert = _Expert(config.expert, config.vocab_size)
        #: Recompute each depth's activations in the backward pass (:meth:`checkpoint_layers`).
        self.checkpointed = False
        for vlm_layer, expert_layer in self.depth_layers():
            setattr(vlm_layer, JOINT_FORWARD, functools.partial(_depth_forward, (vlm_layer, expert_layer)))

    def depth_layers(self) -> list[tuple[GemmaDecoderLayer, GemmaDecoderLayer]]:
        """Per depth, the VLM's and the action expert's decoder layers: the blocks FSDP shards
        together and activation checkpointing recomputes together (they attend jointly, so
        neither is ever called on its own)."""
        return list(zip(self.vlm.layers, self.gemma_expert.model.layers, strict=True))

    def checkpoint_layers(self) -> int:
        """Recompute every depth of the joint stack in the backward pass (non-reentrant
        ``torch.utils.checkpoint``, as openpi's and LeRobot's π0 checkpoint
        ``compute_layer_complete``) instead of keeping its activations.

        Returns:
            the number of depths now checkpointed.
        """
        self.checkpointed = True
        return len(self.vlm.layers)

    @property
    def vlm(self) -> nn.Module:
        """The PaliGemma language model (transformers ``GemmaModel``)."""
        return self.paligemma.model.language_model

    def unused_parameters(self) -> list[nn.Parameter]:
        """Parameters that never influence the actions: the PaliGemma language model's last
        layer after its keys and values (``q_proj``, ``o_proj``, the MLP, the post-attention norm)
        and its final norm. The suffix (action) tokens read the prefix only through each layer's
        keys and values, so these only shape the prefix's own outputs, which π0 never reads
        (their gradient is always exactly 0). Frozen by the RL policy, as the OpenVLA policies
        freeze their towers' unused last block, so that data-parallel training sees no parameter
        without a gradient."""
        last = self.vlm.layers[-1]
        modules = (last.self_attn.q_proj, last.self_attn.o_proj, last.mlp, last.post_attention_layernorm, self.vlm.norm)
        return [parameter for module in modules for parameter in module.parameters()]

    def float32_parameters(self) -> list[nn.Parameter]:
        """The parameters openpi's ``to_bfloat16_for_selected_params`` keeps in float32 when it
        casts the backbone to bfloat16 (``gemma_pytorch.py``): SigLIP's patch and position
        embeddings and every Gemma RMSNorm weight (each layer's input and post-attention norms,
        both stacks' final norms)."""
        embeddings = self.paligemma.model.vision_tower.embeddings
        kept = [*embeddings.patch_embedding.parameters(), *embeddings.position_embedding.parameters()]
        return kept + [module.weight for module in self.modules() if isinstance(module, GemmaRMSNorm)]

    def embed_images(self, images: Tensor) -> Tensor:
        """SigLIP patch features projected to the Gemma width, unscaled (openpi
        ``PaliGemmaWithExpertModel.embed_image``; its ``transformers_replace`` PaliGemma, like
        transformers 5, does not divide them by ``sqrt(width)``).

        Args:
            images: ``(n, 3, image_size, image_size)`` float pixels in [-1, 1].

        Returns:
            ``(n, num_patches, vlm.width)`` in the language model's dtype.
        """
        tower = self.paligemma.model.vision_tower
        embedded = tower.embeddings(images.to(tower.embeddings.patch_embedding.weight.dtype))  # (n, P, vision width)
        # float32 embeddings (openpi's bfloat16: :meth:`float32_parameters`) enter bfloat16 layers
        encoded = tower.encoder(inputs_embeds=embedded.to(tower.encoder.layers[0].layer_norm1.weight.dtype))
        features = tower.post_layernorm(encoded.last_hidden_state)  # SiglipVisionModel.forward, without a head
        projector = self.paligemma.model.multi_modal_projector
        projected = projector(features.to(projector.linear.weight.dtype))  # (n, P, W)
        return projected.to(self.vlm.norm.weight.dtype)

    def embed_language(self, tokens: Tensor) -> Tensor:
        """Token embeddings times ``sqrt(width)`` (Gemma's scaled embedding; openpi ``embed_prefix``
        multiplies explicitly, transformers' ``GemmaTextScaledWordEmbedding`` inside).

        Args:
            tokens: ``(batch, lang_len)`` int64 token ids.

        Returns:
            ``(batch, lang_len, vlm.width)``.
        """
        return self.vlm.embed_tokens(tokens)

    def forward_layers(
        self,
        prefix: Tensor | None,
        suffix: Tensor | None,
        allowed: Tensor,
        position_ids: Tensor,
        cache: PrefixCache | None = None,
    ) -> tuple[Tensor | None, Tensor | None, tuple[Tensor, ...], tuple[Tensor, ...]]:
        """Run the decoder layers over the prefix and/or suffix streams, jointly.

        Args:
            prefix: ``(batch, prefix_len, vlm.width)`` prefix embeddings, or None.
            suffix: ``(batch, suffix_len, expert.width)`` suffix embeddings, or None.
            allowed: ``(batch, queries, keys)`` bool: which key each query attends; queries are the
                given tokens (prefix then suffix), keys the cached prefix (if ``cache``) then them.
            position_ids: ``(batch, queries)`` int64 rotary positions of the given tokens.
            cache: the prefix's keys and values, prepended to every layer's keys and values (the
                prefix itself is then not given).

        Returns:
            ``(prefix_out, suffix_out, keys, values)``: final-normed hidden states of each given
            stream (None for an absent one), ``(batch, len, width)``; and per layer the given
            tokens' keys (rotated) and values, ``(batch, num_kv_heads, queries, head_dim)``.
        """
        streams = [prefix, suffix]
        stacks = [self.vlm, self.gemma_expert.model]
        present = [index for index, hidden in enumerate(streams) if hidden is not None]
        hidden_states = [streams[index] for index in present]
        dtype = self.vlm.layers[0].self_attn.q_proj.weight.dtype
        hidden_states = [hidden.to(dtype) for hidden in hidden_states]
        cos, sin = self.vlm.rotary_emb(hidden_states[0], position_ids)  # each (B, T, head_dim)
        bias = attention_bias(allowed, dtype)  # (B, 1, T, S)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for depth, (vlm_layer, _) in enumerate(self.depth_layers()):
            past = None if cache is None else (cache.keys[depth], cache.values[depth])
            run_depth = getattr(vlm_layer, JOINT_FORWARD)  # FSDP's unshard/reshard around it when sharded
            hidden_states, key, value = run_depth(present, hidden_states, cos, sin, bias, past, self.checkpointed)
            keys.append(key)
            values.append(value)
        outputs: list[Tensor | None] = [None, None]
        for index, hidden in zip(present, hidden_states, strict=True):
            outputs[index] = stacks[index].norm(hidden)
        return outputs[0], outputs[1], tuple(keys), tuple(values)


def _depth_forward(
    layers: tuple[GemmaDecoderLayer, GemmaDecoderLayer],
    present: list[int],
    hidden_states: list[Tensor],
    cos: Tensor,
    sin: Tensor,
    bias: Tensor,
    past: tuple[Tensor, Tensor] | None,
    checkpointed: bool,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """One depth of the joint stack (:func:`_joint_layer` over the layers of the ``present``
    streams: 0 the prefix, 1 the suffix), recomputed in the backward pass when ``checkpointed``
    and gradients are on. Bound to each depth's pair of layers as the VLM layer's
    :data:`JOINT_FORWARD` attribute."""
    chosen = [layers[index] for index in present]
    if checkpointed and torch.is_grad_enabled():
        return checkpoint(_joint_layer, chosen, hidden_states, cos, sin, bias, past, use_reentrant=False)
    return _joint_layer(chosen, hidden_states, cos, sin, bias, past)


def _joint_layer(
    layers: list[GemmaDecoderLayer],
    hidden_states: list[Tensor],
    cos: Tensor,
    sin: Tensor,
    bias: Tensor,
    past: tuple[Tensor, Tensor] | None,
) -> tuple[list[Tensor], Tensor, Tensor]:
    """One decoder layer over several streams, each with its own weights, attending jointly
    (openpi ``gemma_pytorch.py``, ``compute_layer_complete``).

    Args:
        layers: one Gemma decoder layer per stream.
        hidden_states: per stream ``(batch, len_i, width_i)``.
        cos, sin: ``(batch, sum(len_i), head_dim)`` rotary tables of the streams' positions.
        bias: ``(batch, 1, sum(len_i), past_len + sum(len_i))`` additive attention bias.
        past: cached ``(keys, values)``, each ``(batch, num_kv_heads, past_len, head_dim)``, or None.

    Returns:
        the streams' new hidden states, and this layer's keys (rotated) and values of the given
        tokens, each ``(batch, num_kv_heads, sum(len_i), head_dim)``.
    """
    queries, keys, values, residuals = [], [], [], []
    for layer, hidden in zip(layers, hidden_states, strict=True):
        attention = layer.self_attn
        normed = layer.input_layernorm(hidden)
        shape = (*normed.shape[:-1], -1, attention.head_dim)
        queries.append(attention.q_proj(normed).view(shape).transpose(1, 2))  # (B, nh, T_i, hd)
        keys.append(attention.k_proj(normed).view(shape).transpose(1, 2))  # (B, nkv, T_i, hd)
        values.append(attention.v_proj(normed).view(shape).transpose(1, 2))
        residuals.append(hidden)
    query = torch.cat(queries, dim=2)  # (B, nh, T, hd)
    key = torch.cat(keys, dim=2)  # (B, nkv, T, hd)
    value = torch.cat(values, dim=2)
    query, key = apply_rotary_pos_emb(query, key, cos, sin)
    all_keys, all_values = (key, value) if past is None else (torch.cat([past[0], key], 2), torch.cat([past[1], value], 2))
    groups = query.shape[1] // all_keys.shape[1]
    attended = F.scaled_dot_product_attention(
        query,
        all_keys.repeat_interleave(groups, dim=1),  # (B, nh, S, hd)
        all_values.repeat_interleave(groups, dim=1),
        attn_mask=bias,
        scale=layers[0].self_attn.scaling,
    )  # (B, nh, T, hd)
    attended = attended.transpose(1, 2).flatten(2)  # (B, T, nh * hd)
    outputs, start = [], 0
    for layer, residual in zip(layers, residuals, strict=True):
        end = start + residual.shape[1]
        out_proj = layer.self_attn.o_proj
        hidden = residual + out_proj(attended[:, start:end].to(out_proj.weight.dtype))
        hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        outputs.append(hidden)
        start = end
    return outputs, key, value
