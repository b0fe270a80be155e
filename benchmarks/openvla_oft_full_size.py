"""OpenVLA-OFT at its published size: one LoRA update of the RL actor and one rollout sampling call
on a batch of observations, with random weights, seconds per call, peak memory and MFU.

The model is ``OpenVLAOFTPolicy`` (policies/openvla_oft/) with the discrete (bin) head the RL
path uses: the Prismatic VLM of ``openvla/openvla-7b`` (DINOv2 ViT-L/14 with 4 registers + SigLIP
So400m/14 at 224 px, fused MLP projector, Llama-2-7B with its vocabulary padded to 32064) and
OFT's proprio projector (8 LIBERO proprio features -> one token). ``--preset full`` builds it
from the published ``config.json`` fields of ``openvla/openvla-7b`` (:data:`OPENVLA_7B_CONFIG`)
through the project's :func:`~policies.openvla.checkpoint_prismatic.architecture_from_config`:
the tower sizes are its ``PUBLISHED_VISION_BACKBONES["dinosiglip-vit-so-224px"]`` (timm's
``vit_large_patch14_reg4_dinov2`` and ``vit_so400m_patch14_siglip_224``), the decoder
``LlamaConfig``'s defaults (those of Llama-2-7B). That VLA has 7,526,000,880 parameters: the
published checkpoint's 7,541,237,184 less SigLIP's attention-pooling head (15,238,352, never used:
Prismatic reads block L - 2) plus DINOv2's mask token and CLS position row (2,048, transformers'
layout); the proprio projector adds 16,818,176. ``--preset tiny`` is the project's tiny OFT
(``architecture: tiny``) through exactly the same functions.

Parts (the observation: one 224 px camera, the proprio, the prompt of "lift the cube"; chunks of
``--chunk`` actions of ``--action-dim`` values, i.e. ``chunk * action_dim`` parallel-decoded
positions):

- ``update``: one update as the RL actor runs it (vla_rl/trainers/actor.py): LoRA adapters
  (``policy.apply_lora``: rank ``--lora-rank``, alpha ``min(rank, 16)``, the default targets
  ``q/k/v/o/out/gate/up/down_proj`` on the decoder and on the towers but their unused last block:
  SigLIP's attention, and DINOv2's where transformers names it ``q/k/v/o_proj`` (5.23, not 5.17:
  the JSON's ``adapted_towers``); the proprio projector trained fully, as docs/large_policies.md's
  7.5 B recipe), the
  actor's activation checkpointing (``vla_rl.trainers.strategy.enable_gradient_checkpointing``:
  transformers' non-reentrant checkpointing of every decoder and tower layer), policy in train
  mode; forward of ``log_prob_and_entropy_per_dim`` on the batch (in ``--micro-batch`` pieces),
  backward of the summed log-probs, then the optimizer step: the actor's ``torch.optim.Adam``
  (AdamW at weight decay 0 is the same update) with gradient-norm clipping at 1.0. Precision as
  the recipe's FSDP on one device (``--master-weights float32``, default): every weight, LoRA's
  too, computes in ``--dtype`` (``MixedPrecisionPolicy(param_dtype=bf16)``) while Adam updates
  float32 master copies of the trainable ones (``trainer.fsdp.master_dtype: float32``): the bf16
  gradients are cast into them and the updated values copied back. ``--master-weights none``:
  Adam on the trainable parameters in the dtypes the policy holds them (DDP's layout:
  policies/lora.py's adapters, the proprio projector in ``--dtype``; the JSON lists them).
- ``sample``: the rollout call ``sample_actions`` (one parallel pass, no gradients, eval mode) of
  the same LoRA policy on the same batch.

FLOPs (per observation, summed over the batch; :func:`flops_per_observation`). Every matmul is
counted as 2 x fan-in x fan-out per token: ``forward`` = 2 N T summed over the model's weights
(towers on ``1 + registers + patches`` and ``patches`` tokens, projector on the patches, proprio
projector on 1, decoder on all T = 1 + patches + 1 + (prompt - 1) + chunk x action_dim + 1
tokens, LM head on the chunk x action_dim action positions only) plus LoRA's 2 r (fan-in +
fan-out) T and attention's 4 T^2 d per layer (QK^T and AV, PaLM's 12 L H Q T per token for forward
and backward: Chowdhery et al. 2022, arXiv:2204.02311, Appendix B). ``backward`` is what
autograd executes: input gradients (2 N T) through every weight the gradient passes (all decoder
layers and the LM head, the projector, tower layers 0 .. L - 2), weight gradients (2 N T) only
of the trainable ones (LoRA's A and B, the proprio projector), no input gradient where the input
needs none (the towers' first layer's q/k/v), attention backward 8 T^2 d. Full fine-tuning would
be PaLM's 6 N T; a LoRA update is about 4 N T (2 forward + 2 input-gradient), since the frozen
weights get no gradient. Model FLOPs of an update = forward + backward; MFU (PaLM's definition,
Appendix B) = model FLOPs / (update seconds x peak), which excludes the rematerialisation;
HFU adds ``recompute`` (checkpointing runs the forward of every layer the backward passes again:
about 6 N T in all; torch's checkpoint stops each re-run once the layer's last saved tensor is
packed, which skips the last matmul of each SigLIP layer and the last LoRA B of each decoder
layer: at full size the counted recompute is 1.4% more than runs, HFU 0.5% high). The
sampling call's FLOPs are the forward's. The count equals
``torch.utils.flop_counter.FlopCounterMode``'s (tests/test_openvla_oft_full_size_benchmark.py:
forward and backward exactly, on the tiny preset and at full size on ``meta``, with eager
attention, whose matmuls it sees; less the rotary angles' tiny matmul that transformers 5.17
runs). Peak FLOP/s: ``--peak-tflops``, by default NVIDIA's bf16
dense figure of the H100/H200 (989 SXM, 835 NVL, 756 H100 PCIe), required on other CUDA devices;
no MFU on the CPU.

The policy is built directly on ``--device`` in ``--dtype`` (``torch.set_default_dtype`` inside a
``torch.device`` context around the policy's constructor and the LoRA injection): no float32 or
CPU copy of the 7.5 B parameters is made; the inputs and the generator live on the device. There
is no tokenizer for the full size: the prompt is ``--prompt-tokens`` ids (BOS, then random text
ids; default 18, the Llama-2 tokens of the prompt with OpenVLA's trailing empty token, or the tiny
tokenizer's count), the image random uint8 pixels at the tower's size, the proprio random, the
actions random bin values; the cost does not depend on the values.

Peak memory (benchmarks/device_measure.py, which also times the calls, as for
benchmarks/pi0_full_size.py): on CUDA ``torch.cuda.max_memory_allocated`` (and
``max_memory_reserved``) after ``reset_peak_memory_stats``; on CPU the peak resident set size,
reset before each part through ``/proc/self/clear_refs`` where Linux allows it. Both include the
weights. Times are medians of ``--repeats`` calls after ``--warmup`` calls (CUDA
synchronised).

    python benchmarks/openvla_oft_full_size.py --device cuda --out benchmarks/openvla_oft_full_size.json
    python benchmarks/openvla_oft_full_size.py --preset tiny --device cpu --batch 4 --out /tmp/oft_tiny.json

(7.5 B does not fit a CPU machine of 24 GiB: run the full size on a GPU only.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import Tensor

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.device_measure import (
    GIB,
    Step,
    add_measuring_arguments,
    add_out_argument,
    check_device,
    device_name,
    measure_or_out_of_memory,
    print_parts_table,
    record_part,
    synchronize,
    timed,
    wrote,
)
from policies.openvla.checkpoint_prismatic import architecture_from_config
from policies.openvla.configuration_openvla import PrismaticArchitecture
from policies.openvla.policy_base import LORA_TARGET_MODULES
from policies.openvla.processor_openvla import make_observation, prompt_token_ids
from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig

PARTS = ("sample", "update")
PRESETS = ("full", "tiny")
DTYPES = ("bfloat16", "float32")
MASTER_WEIGHTS = ("float32", "none")
#: The instruction of the prompt ("In: What action should the robot take to lift the cube?\nOut:").
INSTRUCTION = "lift the cube"
#: Llama-2 tokens of that prompt as OpenVLA feeds it: <s>, In : What action should the robot take
#: to lift the cube ? \n Out :, then the empty token 29871 that predict_action appends.
LLAMA2_PROMPT_TOKENS = 18
#: The architecture fields of openvla/openvla-7b's config.json (OpenVLA-OFT's LIBERO checkpoints
#: share them); the rest are LlamaConfig's defaults, those of Llama-2-7B.
OPENVLA_7B_CONFIG = {
    "vision_backbone_id": "dinosiglip-vit-so-224px",
    "image_sizes": [224, 224],
    "text_config": {"model_type": "llama", "pad_token_id": 32000, "vocab_size": 32064},
    "pad_to_multiple_of": 64,
    "n_action_bins": 256,
}
#: Parameters of the published openvla/openvla-7b weights (timm layout, SigLIP's attention pool included).
PUBLISHED_OPENVLA_PARAMETERS = 7_541_237_184
#: bf16 dense peak TFLOP/s (NVIDIA's datasheets, without sparsity) by (model, variant in the device
#: name); the first match wins, variant None: the SXM boards ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
HOPPER_PEAK_TFLOPS = {("H100", "PCIe"): 756.0, ("H100", "NVL"): 835.0, ("H200", "NVL"): 835.0,
                      ("H100", None): 989.0, ("H200", None): 989.0}
MAX_GRAD_NORM = 1.0  # trainer.max_grad_norm's default


def full_architecture() -> PrismaticArchitecture:
    """The published OpenVLA-7B architecture (see :data:`OPENVLA_7B_CONFIG`)."""
    return architecture_from_config(OPENVLA_7B_CONFIG, "openvla/openvla-7b config.json")


def policy_config(preset: str, dtype: str, chunk: int, action_dim: int, proprio_dim: int) -> OpenVLAOFTPolicyConfig:
    """The OFT policy of ``preset``: discrete head, one camera, proprio, sdpa attention."""
    return OpenVLAOFTPolicyConfig(architecture=full_architecture() if preset == "full" else "tiny", dtype=dtype,
                                  chunk_size=chunk, action_dim=action_dim, num_images=1, proprio_dim=proprio_dim,
                                  action_head="discrete", attn_implementation="sdpa")


def build_policy(config: OpenVLAOFTPolicyConfig, device: torch.device, lora_rank: int, seed: int = 0):
    """The policy with LoRA adapters (rank ``lora_rank``, the proprio projector trained fully),
    created on ``device`` in ``config.dtype``: no float32 copy, nothing on the CPU."""
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    previous = torch.get_default_dtype()
    torch.manual_seed(seed)
    torch.set_default_dtype(getattr(torch, config.dtype))
    try:
        with torch.device(device):
            policy = OpenVLAOFTPolicy(config)
            base_parameters = sum(p.numel() for p in policy.parameters())
            policy.apply_lora(rank=lora_rank, target_modules=LORA_TARGET_MODULES,
                              trainable_modules=("proprio_projector",))
    finally:
        torch.set_default_dtype(previous)
    return policy, base_parameters


def random_inputs(policy, batch: int, prompt_tokens: int, generator: torch.Generator) -> tuple[TensorDict, Tensor]:
    """Model inputs and actions ``(batch, chunk, action_dim)`` on the generator's device: uint8
    images at the tower's size, prompts of ``prompt_tokens`` ids (BOS, then random non-action
    text ids, no padding), a standard normal proprio, random bin values."""
    device, config = generator.device, policy.config
    size = policy.architecture.vision_towers[0].image_size
    images = torch.randint(0, 256, (batch, config.num_images, size, size, 3), generator=generator, device=device,
                           dtype=torch.uint8)
    text = torch.randint(3, policy.action_tokenizer.token_begin, (batch, prompt_tokens - 1), generator=generator,
                         device=device)
    input_ids = torch.cat([torch.ones(batch, 1, dtype=torch.long, device=device), text], dim=1)  # <s> = 1
    proprio = torch.randn(batch, config.proprio_dim, generator=generator, device=device)
    obs = make_observation(images, input_ids, torch.ones_like(input_ids), proprio)
    bins = torch.randint(0, policy.action_tokenizer.n_bins, (batch, config.chunk_size, config.action_dim),
                         generator=generator, device=device)
    return obs, policy.action_tokenizer.actions_from_bins(bins)


# ------------------------------------------------------------------------------------ FLOPs
def _lora_flops(tokens: int, fan_in: int, fan_out: int, rank: int, input_grad: bool) -> tuple[int, int]:
    """Forward and backward FLOPs of one LoRA adapter ``B A x`` on a frozen linear layer: weight
    gradients of A and B, the gradient into A's output, and into x when x needs one."""
    forward = 2 * tokens * rank * (fan_in + fan_out)
    backward = forward + 2 * tokens * rank * fan_out + (2 * tokens * fan_in * rank if input_grad else 0)
    return forward, backward


def _layer_flops(tokens: int, width: int, linears: list[tuple[int, int, bool, bool]], rank: int,
                 input_grad: bool, backward: bool) -> tuple[int, int]:
    """Forward and backward FLOPs of one transformer layer on ``tokens`` tokens.

    Args:
        linears: ``(fan_in, fan_out, reads_layer_input, adapted)`` per frozen linear layer
            (q/k/v read the normed layer input; o and the MLP read inner activations).
        input_grad: whether the layer's input needs a gradient.
        backward: whether the backward passes through the layer at all.
    """
    attention_grad = input_grad or any(adapted for _, _, reads_input, adapted in linears if reads_input)
    forward = 4 * tokens**2 * width  # QK^T and AV
    grads = 8 * tokens**2 * width if attention_grad else 0
    for fan_in, fan_out, reads_input, adapted in linears:
        needs_input_grad = input_grad if reads_input else attention_grad or input_grad
        forward += 2 * tokens * fan_in * fan_out
        grads += 2 * tokens * fan_in * fan_out if needs_input_grad else 0
        if adapted:
            lora_forward, lora_backward = _lora_flops(tokens, fan_in, fan_out, rank, needs_input_grad)
            forward, grads = forward + lora_forward, grads + lora_backward
    return forward, grads if backward else 0


def flops_per_observation(architecture: PrismaticArchitecture, prompt_tokens: int, num_images: int, proprio_dim: int,
                          action_positions: int, rank: int, adapted_towers: tuple[bool, ...]) -> dict[str, int]:
    """Model FLOPs of one observation (see the module docstring): ``forward``, ``backward``
    (autograd's, no rematerialisation) and ``recompute`` (the forward of the layers activation
    checkpointing runs again), with LoRA adapters of rank ``rank`` on every decoder projection and
    on the attention projections of layers 0 .. L - 2 of each tower in ``adapted_towers``, and a
    trained proprio projector."""
    forward = backward = recompute = 0
    patches = architecture.num_patches
    for tower, adapted in zip(architecture.vision_towers, adapted_towers, strict=True):
        d, f = tower.hidden_size, tower.intermediate_size
        tokens = patches + (1 + tower.num_register_tokens if tower.family == "dinov2" else 0)
        forward += num_images * 2 * patches * 3 * tower.patch_size**2 * d  # patch embedding
        for layer in range(tower.num_layers):
            in_backward = adapted and layer < tower.num_layers - 1  # block L - 1 never reaches the features
            linears = [(d, d, True, in_backward)] * 3 + [(d, d, False, in_backward), (d, f, False, False),
                                                         (f, d, False, False)]
            layer_forward, layer_backward = _layer_flops(tokens, d, linears, rank, layer > 0, in_backward)
            forward, backward = forward + num_images * layer_forward, backward + num_images * layer_backward
            recompute += num_images * layer_forward if in_backward else 0
    vision_dim, llm = sum(t.hidden_size for t in architecture.vision_towers), architecture.llm_dim
    projector = ([(vision_dim, 4 * vision_dim), (4 * vision_dim, llm), (llm, llm)]
                 if len(architecture.vision_towers) == 2 else [(vision_dim, llm), (llm, llm)])
    projector_flops = num_images * patches * sum(2 * fan_in * fan_out for fan_in, fan_out in projector)
    forward += projector_flops
    backward += projector_flops if any(adapted_towers) else 0  # input gradients back to the towers' adapters
    if proprio_dim:
        forward += 2 * (proprio_dim * llm + llm * llm)
        backward += 2 * (proprio_dim * llm + llm * llm) + 2 * llm * llm  # weight gradients, fc2's input gradient
    text = architecture.text_config
    heads, kv_heads = text["num_attention_heads"], text.get("num_key_value_heads") or text["num_attention_heads"]
    head_dim = text.get("head_dim") or llm // heads
    kv, ffn = kv_heads * head_dim, text["intermediate_size"]
    tokens = 1 + num_images * patches + (1 if proprio_dim else 0) + prompt_tokens - 1 + action_positions + 1
    linears = [(llm, heads * head_dim, True, True), (llm, kv, True, True), (llm, kv, True, True),
               (heads * head_dim, llm, False, True), (llm, ffn, False, True), (llm, ffn, False, True),
               (ffn, llm, False, True)]
    input_grad = any(adapted_towers) or bool(proprio_dim)
    for layer in range(text["num_hidden_layers"]):
        layer_forward, layer_backward = _layer_flops(tokens, heads * head_dim, linears, rank, input_grad or layer > 0,
                                                     True)
        forward, backward, recompute = forward + layer_forward, backward + layer_backward, recompute + layer_forward
    lm_head = 2 * action_positions * llm * text["vocab_size"]
    return {"forward": forward + lm_head, "backward": backward + lm_head, "recompute": recompute,
            "decoder_tokens": tokens}


def _dtypes(policy) -> dict[str, str]:
    """The dtypes of the trainable parameters: ``{"lora": ..., "proprio_projector": ...}``."""
    found: dict[str, set[str]] = {}
    for name, parameter in policy.named_parameters():
        if parameter.requires_grad:
            found.setdefault("lora" if "lora_" in name else name.split(".")[0], set()).add(str(parameter.dtype)[6:])
    return {group: "/".join(sorted(dtypes)) for group, dtypes in found.items()}


def adapted_towers(policy) -> tuple[bool, ...]:
    """Which vision towers hold LoRA adapters (DINOv2's attention takes them from transformers 5.23
    on, whose names are ``q/k/v/o_proj``)."""
    backbone = policy.vla.vision_backbone
    towers = [backbone.featurizer] + ([backbone.fused_featurizer] if backbone.fused_featurizer is not None else [])
    return tuple(any("lora_" in name for name, _ in tower.named_parameters()) for tower in towers)


def expected_lora_layers(architecture: PrismaticArchitecture, adapted: tuple[bool, ...]) -> int:
    """LoRA layers :func:`flops_per_observation` assumes: 7 per decoder layer, 4 per tower layer
    but the last of each adapted tower."""
    towers = sum(4 * (t.num_layers - 1) for t, a in zip(architecture.vision_towers, adapted, strict=True) if a)
    return 7 * architecture.text_config["num_hidden_layers"] + towers


# ------------------------------------------------------------------------------------ optimizer
class ActorOptimizer:
    """The actor's step (vla_rl/trainers/actor.py): gradient-norm clipping, then ``torch.optim.Adam``.

    With ``compute_dtype`` (FSDP's mixed precision on one device): Adam runs on float32 master
    copies of the trainable parameters while the model computes with ``compute_dtype`` copies of
    them (``MixedPrecisionPolicy(param_dtype=bf16)``: the LoRA adapters too); the gradients are
    cast into the masters, the updated values copied back. Without: Adam on the trainable
    parameters in the dtypes the policy holds them (policies/lora.py's adapters, the policy's
    proprio projector).
    """

    def __init__(self, parameters: list[torch.nn.Parameter], compute_dtype: torch.dtype | None, lr: float = 1e-5):
        self.parameters = parameters
        self.masters = parameters
        if compute_dtype is not None:
            self.masters = [p.detach().to(torch.float32, copy=True) for p in parameters]
            for parameter in parameters:
                parameter.data = parameter.data.to(compute_dtype)
        self.optimizer = torch.optim.Adam(self.masters, lr=lr)

    def step(self) -> float:
        """Clip, step, zero the gradients; returns the gradient norm before clipping."""
        from vla_rl.trainers.guard import clip_grad_norm

        if self.masters is not self.parameters:
            for parameter, master in zip(self.parameters, self.masters, strict=True):
                master.grad = None if parameter.grad is None else parameter.grad.to(master.dtype)
                parameter.grad = None
        norm = clip_grad_norm(self.masters, MAX_GRAD_NORM)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.masters is not self.parameters:
            with torch.no_grad():
                for parameter, master in zip(self.parameters, self.masters, strict=True):
                    parameter.copy_(master)
        return norm


# ------------------------------------------------------------------------------------ measuring
def make_steps(policy, obs: TensorDict, actions: Tensor, optimizer: ActorOptimizer, micro_batch: int,
               generator: torch.Generator) -> dict[str, Step]:
    """The measured calls (:func:`benchmarks.device_measure.measure`'s steps); each returns its
    seconds by phase: ``forward_s``, and for ``update`` also ``backward_s`` and ``optimizer_s``."""
    device = generator.device
    batch = obs.batch_size[0]

    def sample() -> dict[str, float]:
        policy.eval()
        _, seconds = timed(device, lambda: policy.sample_actions(obs, generator=generator))
        return {"forward_s": seconds}

    def update() -> dict[str, float]:
        policy.train()
        forward_s = backward_s = 0.0
        for start in range(0, batch, micro_batch):
            piece = slice(start, start + micro_batch)
            summed, seconds = timed(device, lambda: policy.log_prob_and_entropy_per_dim(obs[piece], actions[piece])[0]
                                    .sum())  # (b, chunk, action_dim) -> scalar
            forward_s += seconds
            backward_s += timed(device, summed.backward)[1]
        _, optimizer_s = timed(device, optimizer.step)
        return {"forward_s": forward_s, "backward_s": backward_s, "optimizer_s": optimizer_s}

    return {"sample": sample, "update": update}


# ------------------------------------------------------------------------------------ reporting
def peak_tflops(device: torch.device, requested: float | None) -> tuple[float | None, str]:
    """The peak bf16 dense TFLOP/s MFU divides by, and where it comes from: None on the CPU (no
    MFU), else ``requested``, else NVIDIA's datasheet figure of a Hopper GPU
    (:data:`HOPPER_PEAK_TFLOPS`).

    Raises:
        SystemExit: another CUDA device without ``--peak-tflops`` (before anything is built).
    """
    if device.type != "cuda":
        return None, "none: no MFU on the CPU"
    if requested is not None:
        return requested, "--peak-tflops"
    name = torch.cuda.get_device_name(device)
    for (model, variant), peak in HOPPER_PEAK_TFLOPS.items():
        if model in name and (variant is None or variant in name):
            return peak, f"NVIDIA datasheet, {model} {variant or 'SXM'} bf16 dense"
    raise SystemExit(f"--peak-tflops is required on {name!r}: its bf16 dense peak (989 for an H100/H200 SXM)")


def _with_rates(entry: dict, flops: float, hardware_flops: float | None, peak: float | None) -> dict:
    """``entry`` with achieved TFLOP/s, MFU and (with ``hardware_flops``) HFU."""
    if "error" in entry:
        return entry
    seconds = entry["total_s"]
    entry["model_tflops_per_s"] = flops / seconds / 1e12
    entry["mfu"] = None if peak is None else flops / seconds / (peak * 1e12)
    if hardware_flops is not None:
        entry["hfu"] = None if peak is None else hardware_flops / seconds / (peak * 1e12)
    return entry


def print_table(result: dict) -> None:
    what = {"sample": "rollout: sample_actions, no grad",
            "update": f"LoRA r={result['lora_rank']} update: log-probs fwd + bwd + Adam"}
    title = (f"OpenVLA-OFT preset {result['preset']!r}: {result['parameters']:,} parameters "
             f"({result['trainable_parameters']:,} trained), {result['dtype']} on {result['device']} "
             f"({result['device_name']}), batch {result['batch']} x {result['tokens_per_observation']} "
             f"tokens, checkpointing {'on' if result['gradient_checkpointing'] else 'off'}")
    rates = {"TFLOP/s": lambda entry: f"{entry['model_tflops_per_s']:.3g}",
             "MFU": lambda entry: "" if entry["mfu"] is None else f"{entry['mfu']:.1%}"}
    print_parts_table(title, result["parts"], what, ("forward_s", "backward_s", "optimizer_s"), decimals=3,
                      rates=rates, width=180)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=PRESETS, default="full")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="parameter dtype of the policy")
    parser.add_argument("--batch", type=int, default=64, help="observations per call")
    parser.add_argument("--micro-batch", type=int, default=None,
                        help="observations per forward/backward of the update (gradients accumulate); default: --batch")
    parser.add_argument("--chunk", type=int, default=8, help="actions per chunk (OFT's LIBERO: 8)")
    parser.add_argument("--action-dim", type=int, default=7, help="values per action")
    parser.add_argument("--proprio-dim", type=int, default=8, help="proprio features (OFT's LIBERO: 8)")
    parser.add_argument("--prompt-tokens", type=int, default=None,
                        help=f"prompt ids with BOS; default {LLAMA2_PROMPT_TOKENS} (full), the tiny tokenizer's (tiny)")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--no-checkpointing", action="store_true", help="keep every activation (more memory)")
    parser.add_argument("--master-weights", choices=MASTER_WEIGHTS, default="float32",
                        help="float32: FSDP's mixed precision (float32 masters, every weight computing in --dtype); "
                             "none: Adam on the trainable parameters in the policy's own dtypes (DDP)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="peak bf16 dense TFLOP/s for MFU (CUDA); default: 989 on H100/H200 SXM (datasheets)")
    add_measuring_arguments(parser, PARTS)
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    for name in ("batch", "micro_batch", "chunk", "action_dim", "proprio_dim", "prompt_tokens", "lora_rank", "repeats"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.prompt_tokens is not None and args.prompt_tokens < 2:
        parser.error("--prompt-tokens must be >= 2 (BOS and one text token)")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def describe_run(args: argparse.Namespace, policy, base_parameters: int, prompt_tokens: int,
                 flops: dict[str, int], trainable_dtypes: dict[str, str], checkpointed_blocks: int | None) -> dict:
    """The JSON's description of the run: model, sizes, settings and FLOPs (the parts come later)."""
    import peft
    import transformers

    architecture, device = policy.architecture, torch.device(args.device)
    adapted = adapted_towers(policy)
    trainable = [p for p in policy.parameters() if p.requires_grad]
    update_flops = args.batch * (flops["forward"] + flops["backward"])
    recompute_flops = 0 if args.no_checkpointing else args.batch * flops["recompute"]
    mixed = args.master_weights == "float32"
    return {
        "preset": args.preset, "parameters": base_parameters,
        "vla_parameters": sum(p.numel() for name, p in policy.vla.named_parameters() if "lora_" not in name),
        "proprio_projector_parameters": sum(p.numel() for p in policy.proprio_projector.parameters()),
        "published_openvla_parameters": PUBLISHED_OPENVLA_PARAMETERS if args.preset == "full" else None,
        "lora_parameters": sum(p.numel() for name, p in policy.named_parameters() if "lora_" in name),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "weights_gib": sum(p.numel() * p.element_size() for p in policy.parameters()) / GIB,
        "lora_layers": sum(1 for name, _ in policy.named_modules() if name.endswith(".lora_A")),
        "lora_layers_in_flop_count": expected_lora_layers(architecture, adapted), "adapted_towers": list(adapted),
        "dtype": args.dtype, "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "transformers": transformers.__version__, "peft": peft.__version__, "threads": torch.get_num_threads(),
        "batch": args.batch, "micro_batch": min(args.micro_batch or args.batch, args.batch),
        "cameras": policy.config.num_images, "image_size": architecture.vision_towers[0].image_size,
        "patches_per_image": architecture.num_patches, "prompt_tokens": prompt_tokens, "proprio_dim": args.proprio_dim,
        "chunk": args.chunk, "action_dim": args.action_dim, "tokens_per_observation": flops["decoder_tokens"],
        "lora_rank": args.lora_rank, "lora_alpha": min(args.lora_rank, 16), "lora_targets": list(LORA_TARGET_MODULES),
        "trainable_modules": ["lora adapters", "proprio_projector"],
        "gradient_checkpointing": not args.no_checkpointing, "checkpointed_blocks": checkpointed_blocks,
        "optimizer": "torch.optim.Adam (the actor's; lr 1e-5, no weight decay) after clip_grad_norm 1.0",
        "master_weights": (f"float32 copies of the trainable parameters, the model computing in {args.dtype} "
                           "(FSDP's master_dtype float32 + MixedPrecisionPolicy)" if mixed else
                           f"none: Adam on the trainable parameters as the policy holds them {trainable_dtypes}"),
        "trainable_dtypes_in_policy": trainable_dtypes, "trainable_dtypes_computing": _dtypes(policy),
        "flops": {
            "forward_per_observation": flops["forward"], "backward_per_observation": flops["backward"],
            "recompute_per_observation": flops["recompute"], "update_model_flops": update_flops,
            "update_hardware_flops": update_flops + recompute_flops, "sample_flops": args.batch * flops["forward"],
            "formula": "model FLOPs = forward (2 N T per weight matrix over its tokens + 2 r (in + out) T per LoRA "
                       "adapter + 4 T^2 d attention per layer) + backward as autograd runs it (input gradients "
                       "2 N T through every weight the gradient passes, weight gradients 2 N T of the trainable "
                       "LoRA/proprio weights only, 8 T^2 d attention), ~4 N T for LoRA; MFU = model FLOPs / "
                       "(seconds x peak) (PaLM, Chowdhery et al. 2022, App. B: rematerialisation excluded); HFU adds "
                       "the checkpointed layers' recomputed forward",
        },
        "warmup": args.warmup, "repeats": args.repeats,
        "tokenizer": "none: BOS + random text ids" if policy.tokenizer is None else "tiny: BOS + random text ids",
    }


def main(argv: list[str] | None = None) -> dict:
    from vla_rl.trainers.strategy import enable_gradient_checkpointing

    args = parse_args(argv)
    device = torch.device(args.device)
    peak, peak_source = peak_tflops(device, args.peak_tflops)  # before the build: fails at once without one
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = policy_config(args.preset, args.dtype, args.chunk, args.action_dim, args.proprio_dim)
    start = time.perf_counter()
    policy, base_parameters = build_policy(config, device, args.lora_rank, args.seed)
    synchronize(device)
    build_s = time.perf_counter() - start
    checkpointed_blocks = 0
    if not args.no_checkpointing:
        _, checkpointed_blocks = enable_gradient_checkpointing(policy)
    prompt_tokens = args.prompt_tokens or (len(prompt_token_ids(policy.tokenizer, INSTRUCTION))
                                           if policy.tokenizer is not None else LLAMA2_PROMPT_TOKENS)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    obs, actions = random_inputs(policy, args.batch, prompt_tokens, generator)
    trainable_dtypes = _dtypes(policy)  # as the policy holds them, before the mixed-precision cast
    optimizer = ActorOptimizer([p for p in policy.parameters() if p.requires_grad],
                               getattr(torch, args.dtype) if args.master_weights == "float32" else None)
    steps = make_steps(policy, obs, actions, optimizer, min(args.micro_batch or args.batch, args.batch), generator)
    flops = flops_per_observation(policy.architecture, prompt_tokens, config.num_images, args.proprio_dim,
                                  args.chunk * args.action_dim, args.lora_rank, adapted_towers(policy))
    result = {**describe_run(args, policy, base_parameters, prompt_tokens, flops, trainable_dtypes,
                             checkpointed_blocks),
              "peak_tflops": peak, "peak_tflops_source": peak_source, "build_s": build_s, "parts": {}}
    flops_of_part = {"update": (result["flops"]["update_model_flops"], result["flops"]["update_hardware_flops"]),
                     "sample": (result["flops"]["sample_flops"], None)}  # (model FLOPs, hardware FLOPs or None)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    for part in (p for p in PARTS if p in args.parts):  # sampling first: its peak has no gradients in it
        entry = measure_or_out_of_memory(steps[part], policy, device, args.warmup, args.repeats)
        record_part(result, part, _with_rates(entry, *flops_of_part[part], peak), args.out, decimals=3)
    print_table(result)
    wrote(args.out)
    return result


if __name__ == "__main__":
    main()
