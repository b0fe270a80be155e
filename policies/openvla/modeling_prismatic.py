"""The Prismatic VLM of OpenVLA built from transformers components: vision tower(s) → MLP
projector → Llama decoder, with the image patches inserted after the BOS token.

Written from the layout of ``prismatic/extern/hf/modeling_prismatic.py`` (openvla/openvla):

- ``PrismaticVisionBackbone``: timm ViTs whose forward is ``get_intermediate_layers(n={L - 2})``,
  i.e. the output of the second-to-last block, without the final norm, prefix tokens (CLS,
  registers) dropped; with a fused backbone (``dinosiglip``) DINOv2 and SigLIP each see their own
  normalisation of the image and their patch features are concatenated (``dim=2``). Here the
  towers are transformers' ``Dinov2WithRegistersModel`` and ``SiglipVisionModel`` (their
  ``hidden_states[-2]``: the same block output).
- ``PrismaticProjector``: ``fc1 → GELU → fc2`` for one tower; ``fc1 (4 × vision_dim) → GELU → fc2
  → GELU → fc3`` for fused towers.
- multimodal embeddings ``[BOS, patches, text[1:]]`` (``PrismaticForConditionalGeneration.forward``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import (
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
    LlamaConfig,
    LlamaForCausalLM,
    SiglipVisionConfig,
    SiglipVisionModel,
)

from policies.image_resize import resize_uint8
from policies.openvla.configuration_openvla import (
    PrismaticArchitecture,
    VisionTowerConfig,
)


def build_vision_model(config: VisionTowerConfig, attn_implementation: str) -> nn.Module:
    """A transformers ViT for one tower: ``SiglipVisionModel`` (no pooling head) or
    ``Dinov2WithRegistersModel`` (LayerScale, registers)."""
    common = dict(
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        image_size=config.image_size,
        patch_size=config.patch_size,
        hidden_act=config.hidden_act,
        layer_norm_eps=config.layer_norm_eps,
        attn_implementation=attn_implementation,
    )
    if config.family == "siglip":
        return SiglipVisionModel(SiglipVisionConfig(vision_use_head=False, **common))
    return Dinov2WithRegistersModel(
        Dinov2WithRegistersConfig(
            num_register_tokens=config.num_register_tokens,
            mlp_ratio=config.intermediate_size // config.hidden_size,
            qkv_bias=True,
            layerscale_value=1.0,
            **{k: v for k, v in common.items() if k != "intermediate_size"},
        )
    )


class VisionTower(nn.Module):
    """One ViT returning Prismatic's patch features.

    Args:
        config: the tower.
        attn_implementation: ``"sdpa"`` or ``"eager"``.
    """

    def __init__(self, config: VisionTowerConfig, attn_implementation: str) -> None:
        super().__init__()
        self.config = config
        self.model = build_vision_model(config, attn_implementation)
        self.num_prefix_tokens = 1 + config.num_register_tokens if config.family == "dinov2" else 0
        self.register_buffer("mean", torch.tensor(config.image_mean).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(config.image_std).view(1, 3, 1, 1), persistent=False)
        # The features are the second-to-last block's output: the last block, the final norm and
        # DINOv2's mask token never reach them. Frozen, so that a data-parallel trainer sees no
        # trainable parameter without a gradient.
        for parameter in self.unused_parameters():
            parameter.requires_grad_(False)

    def unused_parameters(self) -> list[nn.Parameter]:
        """Parameters of the ViT that Prismatic's features do not depend on."""
        if self.config.family == "dinov2":
            modules, extra = [self.model.encoder.layer[-1], self.model.layernorm], [self.model.embeddings.mask_token]
        else:
            modules, extra = [self.model.encoder.layers[-1], self.model.post_layernorm], []
        return [parameter for module in modules for parameter in module.parameters()] + extra

    def preprocess(self, images: Tensor) -> Tensor:
        """uint8 ``(batch, H, W, 3)`` RGB → normalised ``(batch, 3, S, S)`` pixels (``S =
        image_size``): :meth:`resize` then :meth:`normalize`."""
        return self.normalize(self.resize(images))

    def resize(self, images: Tensor) -> Tensor:
        """uint8 ``(batch, H, W, 3)`` → uint8 ``(batch, 3, S, S)``: PIL's bicubic resize of 8-bit
        images when ``H, W != S``, as OpenVLA's processor resizes its PIL images
        (:func:`policies.image_resize.resize_uint8`, on the images' device)."""
        size = self.config.image_size
        return resize_uint8(images.permute(0, 3, 1, 2), size, size, "bicubic")

    def normalize(self, frames: Tensor) -> Tensor:
        """uint8 ``(batch, 3, S, S)`` (any memory layout) → ``(x / 255 - mean) / std`` in the
        tower's dtype, contiguous (the patch convolution sees one layout whichever way the frames
        were resized: the same values from a model frame as from the raw one)."""
        pixels = (frames.float() / 255.0 - self.mean) / self.std
        return pixels.to(self.model.dtype).contiguous()

    def forward(self, pixel_values: Tensor) -> Tensor:
        """``(batch, 3, S, S)`` pixels → ``(batch, num_patches, hidden_size)``: the output of the
        second-to-last block with prefix tokens dropped."""
        hidden_states = self.model(pixel_values=pixel_values, output_hidden_states=True).hidden_states
        return hidden_states[-2][:, self.num_prefix_tokens :]


class PrismaticVisionBackbone(nn.Module):
    """``featurizer`` (first tower) and, for fused backbones, ``fused_featurizer``."""

    def __init__(self, towers: tuple[VisionTowerConfig, ...], attn_implementation: str) -> None:
        super().__init__()
        self.featurizer = VisionTower(towers[0], attn_implementation)
        self.fused_featurizer = VisionTower(towers[1], attn_implementation) if len(towers) == 2 else None
        self.embed_dim = sum(tower.hidden_size for tower in towers)

    @property
    def image_size(self) -> int | None:
        """The towers' common input side; None when the fused towers take different sizes."""
        sizes = {self.featurizer.config.image_size}
        if self.fused_featurizer is not None:
            sizes.add(self.fused_featurizer.config.image_size)
        return sizes.pop() if len(sizes) == 1 else None

    def forward(self, images: Tensor) -> Tensor:
        """uint8 ``(batch, H, W, 3)`` images → ``(batch, num_patches, embed_dim)`` features (the
        images resized once when both towers take the same size, as OpenVLA's published ones)."""
        frames = self.featurizer.resize(images)
        patches = self.featurizer(self.featurizer.normalize(frames))
        if self.fused_featurizer is None:
            return patches
        if self.image_size is None:
            frames = self.fused_featurizer.resize(images)
        fused = self.fused_featurizer(self.fused_featurizer.normalize(frames))
        return torch.cat([patches, fused], dim=2)


class PrismaticProjector(nn.Module):
    """Vision features → LLM embeddings (module names ``fc1``, ``fc2``, ``fc3`` as published)."""

    def __init__(self, fused: bool, vision_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fused = fused
        if fused:
            self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
            self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
            self.fc3 = nn.Linear(llm_dim, llm_dim)
        else:
            self.fc1 = nn.Linear(vision_dim, llm_dim)
            self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, features: Tensor) -> Tensor:
        """``(..., vision_dim)`` → ``(..., llm_dim)``."""
        hidden = self.fc2(F.gelu(self.fc1(features)))
        return self.fc3(F.gelu(hidden)) if self.fused else hidden


class PrismaticVLM(nn.Module):
    """Vision backbone, projector and ``LlamaForCausalLM`` (``language_model``).

    Args:
        architecture: the model sizes.
        attn_implementation: ``"sdpa"`` or ``"eager"``, for the towers and the decoder.
    """

    def __init__(self, architecture: PrismaticArchitecture, attn_implementation: str = "sdpa") -> None:
        super().__init__()
        self.architecture = architecture
        self.vision_backbone = PrismaticVisionBackbone(architecture.vision_towers, attn_implementation)
        self.projector = PrismaticProjector(
            len(architecture.vision_towers) == 2, self.vision_backbone.embed_dim, architecture.llm_dim
        )
        text_config = LlamaConfig(**architecture.text_config, attn_implementation=attn_implementation)
        self.language_model = LlamaForCausalLM(text_config)

    def embed_images(self, images: Tensor) -> Tensor:
        """uint8 ``(batch, num_images, H, W, 3)`` → ``(batch, num_images * num_patches, llm_dim)``
        projected patches, image after image (OpenVLA-OFT's multi-image input)."""
        batch, num_images = images.shape[:2]
        features = self.vision_backbone(images.flatten(0, 1))  # (B * I, N, Dv)
        projected = self.projector(features)  # (B * I, N, D)
        return projected.reshape(batch, num_images * projected.shape[1], projected.shape[2])

    def embed_tokens(self, input_ids: Tensor) -> Tensor:
        """``(batch, len)`` ids → ``(batch, len, llm_dim)`` input embeddings."""
        return self.language_model.get_input_embeddings()(input_ids)

    def multimodal_prefix(
        self, images: Tensor, input_ids: Tensor, attention_mask: Tensor, extra_tokens: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``[BOS, image patches, extra tokens, text[1:]]`` embeddings and their 0/1 mask.

        Args:
            images: uint8 ``(batch, num_images, H, W, 3)``.
            input_ids: ``(batch, prompt_len)`` int64, BOS in column 0 (see the processor).
            attention_mask: ``(batch, prompt_len)`` 0/1.
            extra_tokens: optional ``(batch, k, llm_dim)`` embeddings placed after the patches
                (OpenVLA-OFT's proprio token).

        Returns:
            embeddings ``(batch, 1 + num_images * num_patches + k + prompt_len - 1, llm_dim)`` and
            mask ``(batch, same)`` int64.
        """
        patches = self.embed_images(images).to(self.language_model.dtype)
        if extra_tokens is not None:
            patches = torch.cat([patches, extra_tokens.to(patches.dtype)], dim=1)
        text = self.embed_tokens(input_ids)
        embeddings = torch.cat([text[:, :1], patches, text[:, 1:]], dim=1)
        mask = attention_mask.long()
        patch_mask = mask.new_ones(mask.shape[0], patches.shape[1])
        return embeddings, torch.cat([mask[:, :1], patch_mask, mask[:, 1:]], dim=1)
