"""Seconds and exactness of drawing one token per row (``policies/sampling.py``) against
``torch.multinomial`` (the baseline), in the same run.

Each part draws one class per row of ``--rows`` rows over ``K`` classes (512: OpenVLA's action
bins and more; 49,152: SmolLM2's vocabulary; 151,936: Qwen2's), the median of ``--repeats``
calls, with three samplers:

- ``multinomial``: ``torch.multinomial(probs, 1, generator=...)``, the baseline;
- ``two_stage``: :func:`policies.sampling.sample_categorical`, as the policies sample now (a
  block of classes, then a class in it);
- ``one_float32_cumsum``: one float32 cumulative sum over the row and a float32 uniform, as
  before 2026-12-03 (written out below).

The rows are softmaxes of N(0, 3^2) logits with one class raised to ``--dominant`` of the row's
probability, as a language model's next-token distribution often is. Beside the timings the JSON
records ``total_variation``: for each part and inverse-transform sampler, the total-variation
distance between the distribution it draws from (computed from its sums, not sampled) and the
rows' softmax normalised in float64, averaged over the rows.

    python benchmarks/categorical_sampling.py --out benchmarks/categorical_sampling.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from policies.sampling import BLOCK_SIZE, sample_categorical

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.baseline_table import (  # noqa: E402  (after the path above)
    parse_arguments,
    report,
    seconds,
    write_record,
)

CLASSES = (512, 49_152, 151_936)


def float32_inverse_transform(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``sample_categorical`` before 2026-12-03: one float32 cumulative sum, a float32 uniform."""
    cdf = probs.cumsum(-1)
    total = cdf[..., -1:]
    uniform = torch.rand(tuple(total.shape), generator=generator, dtype=cdf.dtype)
    point = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, point, right=True).squeeze(-1)


def next_token_probs(rows: int, classes: int, dominant: float) -> torch.Tensor:
    """``(rows, classes)`` float32 softmaxes of N(0, 9) logits, class ``r`` of row ``r`` raised so
    that it holds ``dominant`` of the row's probability."""
    logits = torch.randn(rows, classes, generator=torch.Generator().manual_seed(0)) * 3.0
    rest = logits.logsumexp(-1)  # (rows,)
    index = torch.arange(rows) % classes
    logits[torch.arange(rows), index] = rest + math.log(dominant / (1.0 - dominant))
    return logits.softmax(-1)


def drawn_distributions(probs: torch.Tensor) -> dict[str, torch.Tensor]:
    """``(rows, classes)`` float64: the distribution each inverse-transform sampler draws from,
    from the sums it makes (a class's share of its cumulative sum's step)."""
    one = probs.cumsum(-1).double()
    steps = torch.diff(one, dim=-1, prepend=one.new_zeros(one.shape[0], 1)) / one[:, -1:]
    blocks = probs.split(BLOCK_SIZE, dim=-1)
    block_sums = torch.stack([block.sum(-1) for block in blocks], dim=-1).double()  # float32 sums, as sampled
    block_shares = block_sums / block_sums.sum(-1, keepdim=True)
    within = [block.double() / block.double().sum(-1, keepdim=True) for block in blocks]
    two_stage = torch.cat([share[:, None] * part for share, part in zip(block_shares.unbind(-1), within)], dim=-1)
    return {"two_stage": two_stage, "one_float32_cumsum": steps}


def total_variation(drawn: torch.Tensor, probs: torch.Tensor) -> float:
    """Mean over rows of the total-variation distance between ``drawn`` and ``probs`` normalised
    in float64."""
    exact = probs.double() / probs.double().sum(-1, keepdim=True)
    return float(0.5 * (drawn - exact).abs().sum(-1).mean())


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="rows sampled per call (a decoding batch)")
    parser.add_argument("--dominant", type=float, default=0.99, help="the dominant class's probability")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a DAG worker on 2 cores: 1)")
    parser.add_argument("--out", type=Path, default=None)
    args = parse_arguments(parser, argv, ("rows", "repeats", "threads"))
    if not 0 < args.dominant < 1:
        parser.error(f"--dominant must be a probability in (0, 1), got {args.dominant}")
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    parts, exactness = {}, {}
    for classes in CLASSES:
        probs = next_token_probs(args.rows, classes, args.dominant)
        parts[f"{classes}_classes"] = {
            "multinomial": seconds(lambda: torch.multinomial(probs, 1, generator=generator), args.repeats),
            "two_stage": seconds(lambda: sample_categorical(probs, generator), args.repeats),
            "one_float32_cumsum": seconds(lambda: float32_inverse_transform(probs, generator), args.repeats),
        }
        exactness[f"{classes}_classes"] = {name: total_variation(drawn, probs)
                                           for name, drawn in drawn_distributions(probs).items()}
    out, args.out = args.out, None
    result = report(parts, "multinomial", "sampler",
                    f"One draw per row, {args.rows} rows, dominant class {args.dominant}, median of {args.repeats} "
                    f"calls, {torch.get_num_threads()} torch thread(s)", args)
    args.out = out
    result["settings"]["out"] = str(out) if out else None
    result["total_variation"] = exactness
    print("| classes | total variation, two_stage | one_float32_cumsum |")
    print("|---|---|---|")
    for part, values in exactness.items():
        print(f"| {part.split('_')[0]} | {values['two_stage']:.2e} | {values['one_float32_cumsum']:.2e} |")
    if out is not None:
        write_record(out, result)
    return result


if __name__ == "__main__":
    main()
