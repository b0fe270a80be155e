"""π0 at its published size (issue 19): one behaviour-cloning step, one RL step and one rollout
sampling call of the π0 model with random weights, with seconds per call and peak memory.

- ``bc``: ``PI0Model.flow_matching_loss`` (the mean over the batch, chunk and ``max_action_dim``
  values, as ``PI0Policy.bc_loss``) forward + backward;
- ``rl``: the RL forward of a stored Flow-SDE denoising chain of ``num_steps`` steps (what
  ``PI0Policy.log_prob_and_entropy_per_dim`` runs: the prefix cache with gradients, then
  ``FlowSDESampler.log_prob_and_entropy_of_chain``, one velocity call of the action expert per
  step) and the backward of the summed log-densities of the scored values (the first
  ``--action-dim``), which is what a policy-gradient loss backpropagates through (the loss's own
  arithmetic is negligible);
- ``sample``: the rollout: the prefix cache and ``num_steps`` Flow-SDE denoising steps
  (``FlowSDESampler.sample_chain``), without gradients.

No optimizer step (Adam's state would add two float32 copies of the trainable parameters) and no
activation checkpointing: the benchmark never enables it (the JSON records
``"gradient_checkpointing": false``), although the policy can (``PI0Policy.checkpoint_activations``,
``trainer.gradient_checkpointing``). The parameters the RL policy freezes
(``PaliGemmaWithExpert.unused_parameters``: they never reach the actions) are frozen here too;
every other parameter gets a gradient, in the parameters' dtype. ``--release-grads`` drops each
gradient as soon as the backward has accumulated it (a post-accumulate-grad hook, as an optimizer
run inside the backward would): the backward computes the same, the peak then holds no gradient
buffers (add ``gradients_gib`` for a run that keeps them); for a machine short of memory.

The model is built directly on ``--device`` in ``--dtype`` (``torch.set_default_dtype`` inside a
``torch.device`` context, then ``PI0Model.cast_parameters`` as ``PI0Policy`` does: openpi's dtypes,
float32 for SigLIP's patch and position embeddings, the RMSNorm weights and the flow-matching
projections), so no float32 copy of the 3.2B parameters is made. There is no tokenizer: the
prompt is ``--prompt-tokens`` random token ids of the preset's vocabulary (no padding), the images
random pixels in [-1, 1] (every camera present), the state random; the cost does not depend on the
values. Every random tensor and the generator live on the device.

Peak memory (benchmarks/device_measure.py, which also times the calls): on CUDA
``torch.cuda.max_memory_allocated`` (and ``max_memory_reserved``) after
``reset_peak_memory_stats``; on CPU the peak resident set size (``resource.getrusage``), reset
before each part through ``/proc/self/clear_refs`` where Linux allows it (otherwise the process's
peak so far: the JSON says which). Both include the weights. Times are medians of ``--repeats``
calls after ``--warmup`` calls (CUDA synchronised).

    flock /tmp/vla_heavy.lock nice -n 19 python benchmarks/pi0_full_size.py --device cpu --repeats 1 --warmup 0 \
        --out benchmarks/pi0_full_size.json                                # the committed CPU record
    python benchmarks/pi0_full_size.py --device cuda --out /tmp/pi0.json   # bf16, B = 1, 3 cameras
    python benchmarks/pi0_full_size.py --preset tiny                       # a quick check, no record
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
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
from policies.pi0.configuration_pi0 import (
    MODEL_PRESETS,
    PI0ModelConfig,
    pi0_model_preset,
)
from policies.pi0.flow_sampling import FlowSDESampler
from policies.pi0.modeling_pi0 import PI0Inputs, PI0Model

PARTS = ("sample", "bc", "rl")
DTYPES = ("bfloat16", "float16", "float32")


def build_model(config: PI0ModelConfig, device: torch.device, dtype: torch.dtype, seed: int = 0) -> PI0Model:
    """A :class:`PI0Model` with random weights, created on ``device`` in ``dtype`` (no float32
    copy first), its never-used parameters frozen as ``PI0Policy`` freezes them."""
    previous = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                model = PI0Model(config)
        finally:
            torch.set_default_dtype(previous)
    model.cast_parameters(dtype)  # openpi's dtypes, as PI0Policy casts; the rotary tables stay float32
    for parameter in model.paligemma_with_expert.unused_parameters():
        parameter.requires_grad_(False)
    return model


def random_inputs(config: PI0ModelConfig, batch: int, cameras: int, prompt_tokens: int,
                  generator: torch.Generator) -> tuple[PI0Inputs, Tensor]:
    """Tokenizer-free model inputs and target actions ``(batch, chunk_size, max_action_dim)``, all
    on the generator's device: random pixels in [-1, 1], ``prompt_tokens`` random token ids of the
    vocabulary (no padding), a random state."""
    device = generator.device
    size = config.vision.image_size
    images = torch.rand(batch, cameras, 3, size, size, generator=generator, device=device) * 2 - 1
    tokens = torch.randint(0, config.vocab_size, (batch, prompt_tokens), generator=generator, device=device)
    inputs = PI0Inputs(images=images, image_masks=torch.ones(batch, cameras, dtype=torch.bool, device=device),
                       lang_tokens=tokens, lang_masks=torch.ones_like(tokens, dtype=torch.bool),
                       state=torch.randn(batch, config.max_state_dim, generator=generator, device=device))
    actions = torch.rand(batch, config.chunk_size, config.max_action_dim, generator=generator, device=device) * 2 - 1
    return inputs, actions


def velocity_fn(model: PI0Model, inputs: PI0Inputs):
    """The samplers' velocity function on one prefix cache (as ``PI0Policy._velocity_fn``)."""
    cache = model.prefix_cache(inputs)
    return lambda x_t, t: model.velocity_and_features(cache, x_t, t, inputs.state)


# ------------------------------------------------------------------------------------ measuring
def _release_grad(parameter: torch.nn.Parameter) -> None:
    parameter.grad = None


def make_steps(model: PI0Model, inputs: PI0Inputs, actions: Tensor, num_steps: int, action_dim: int,
               generator: torch.Generator) -> dict[str, Step]:
    """The three measured calls (:func:`benchmarks.device_measure.measure`'s steps); each returns
    its seconds by phase: ``forward_s``, and ``backward_s`` but for ``sample``."""
    device = generator.device
    sampler = FlowSDESampler(noise_level=0.5)
    chains: list[Tensor] = []  # the last sampled chain: what the RL step scores

    def sample() -> dict[str, float]:
        noise = model.sample_noise(inputs.batch_size, generator, device)
        with torch.no_grad():
            flow, seconds = timed(device, lambda: sampler.sample_chain(velocity_fn(model, inputs), noise, num_steps,
                                                                       generator))
        chains[:] = [flow.chain]  # (B, N + 1, chunk, max_action_dim)
        return {"forward_s": seconds}

    def bc() -> dict[str, float]:
        loss, forward_s = timed(device, lambda: model.flow_matching_loss(inputs, actions, generator=generator).mean())
        _, backward_s = timed(device, loss.backward)
        model.zero_grad(set_to_none=True)
        return {"forward_s": forward_s, "backward_s": backward_s}

    def rl() -> dict[str, float]:
        if not chains:
            sample()

        def forward() -> Tensor:
            log_probs, _ = sampler.log_prob_and_entropy_of_chain(velocity_fn(model, inputs), chains[0])
            return -log_probs[..., :action_dim].sum()  # (B, N, chunk, D) -> the scored values

        loss, forward_s = timed(device, forward)
        _, backward_s = timed(device, loss.backward)
        model.zero_grad(set_to_none=True)
        return {"forward_s": forward_s, "backward_s": backward_s}

    return {"sample": sample, "bc": bc, "rl": rl}


# ------------------------------------------------------------------------------------ reporting
def print_table(result: dict) -> None:
    what = {"sample": f"rollout: prefix cache + {result['num_steps']} Flow-SDE steps, no grad",
            "bc": "behaviour cloning: flow-matching loss fwd + bwd",
            "rl": f"RL: log-probs of a {result['num_steps']}-step chain fwd + bwd"}
    title = (f"π0 preset {result['preset']!r}: {result['parameters']:,} parameters, {result['dtype']} on "
             f"{result['device']} ({result['device_name']}), batch {result['batch']}, "
             f"{result['cameras']} cameras of {result['image_size']}², {result['prompt_tokens']} prompt tokens")
    print_parts_table(title, result["parts"], what, ("forward_s", "backward_s"), decimals=2, width=160)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=MODEL_PRESETS, default="pi0")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16", help="parameter dtype of the whole model")
    parser.add_argument("--batch", type=int, default=1, help="observations per call")
    parser.add_argument("--cameras", type=int, default=3, help="images per observation (openpi's π0: 3)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="default: the preset's tokenizer_max_length")
    parser.add_argument("--num-steps", type=int, default=None, help="denoising steps; default: the preset's")
    parser.add_argument("--action-dim", type=int, default=None,
                        help="scored action values; default 7 (LIBERO), at most the preset's max_action_dim")
    add_measuring_arguments(parser, PARTS, repeats_help="measured calls per part (CPU at full size: 1)")
    parser.add_argument("--release-grads", action="store_true",
                        help="drop each gradient once accumulated: the peak then excludes the gradient buffers")
    parser.add_argument("--seed", type=int, default=0)
    add_out_argument(parser)
    args = parser.parse_args(argv)
    check_device(parser, args.device)
    for name in ("batch", "cameras", "repeats", "action_dim", "prompt_tokens", "num_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = pi0_model_preset(args.preset)
    prompt_tokens = args.prompt_tokens or config.tokenizer_max_length
    num_steps = args.num_steps or config.num_steps
    action_dim = args.action_dim or min(7, config.max_action_dim)
    if action_dim > config.max_action_dim:
        raise SystemExit(f"--action-dim {action_dim} exceeds the preset's max_action_dim {config.max_action_dim}")

    start = time.perf_counter()
    model = build_model(config, device, dtype, args.seed)
    synchronize(device)
    build_s = time.perf_counter() - start
    model.train()
    if args.release_grads:
        for parameter in model.parameters():
            if parameter.requires_grad:
                parameter.register_post_accumulate_grad_hook(_release_grad)
    generator = torch.Generator(device=device).manual_seed(args.seed)
    inputs, actions = random_inputs(config, args.batch, args.cameras, prompt_tokens, generator)
    steps = make_steps(model, inputs, actions, num_steps, action_dim, generator)
    parameters = list(model.parameters())
    trainable = [p for p in parameters if p.requires_grad]
    result = {
        "preset": args.preset, "parameters": sum(p.numel() for p in parameters),
        "trainable_parameters": sum(p.numel() for p in trainable),
        "weights_gib": sum(p.numel() * p.element_size() for p in parameters) / GIB,
        "gradients_gib": sum(p.numel() * p.element_size() for p in trainable) / GIB,
        "dtype": args.dtype, "device": str(device), "device_name": device_name(device),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "batch": args.batch,
        "cameras": args.cameras, "image_size": config.vision.image_size, "prompt_tokens": prompt_tokens,
        "prefix_tokens": args.cameras * config.num_image_tokens + prompt_tokens, "chunk_size": config.chunk_size,
        "max_action_dim": config.max_action_dim, "num_steps": num_steps, "action_dim": action_dim,
        "warmup": args.warmup, "repeats": args.repeats, "build_s": build_s, "gradient_checkpointing": False,
        "release_grads": args.release_grads, "tokenizer": "none: random token ids of the vocabulary", "parts": {},
    }
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
    for part in (p for p in PARTS if p in args.parts):  # sampling first: its peak has no gradients in it
        entry = measure_or_out_of_memory(steps[part], model, device, args.warmup, args.repeats)
        record_part(result, part, entry, args.out, decimals=2)
    print_table(result)
    wrote(args.out)
    return result


if __name__ == "__main__":
    main()
