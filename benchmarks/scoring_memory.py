"""Peak memory and seconds of no-gradient scoring of LLM responses (the reference's
``ref_log_probs``, the old policy's log-probs): ``CausalLMPolicy.log_probs`` (the log-softmax one
response at a time, no entropy) against the baseline of the same run, the pass the scoring made
before 2026-12-05 (``log_probs_and_entropy``: the batch's log-softmax, and an entropy it dropped).

The model is the tiny Qwen2 of the LLM templates (2 layers, width 64) with its vocabulary padded to
``--vocab`` rows (Qwen2.5's 151,936 by default): the pass's memory is the logits' and what is
computed from them. Each row runs in its own process, so that each peak is its own: on the CPU the
peak resident set size during the pass (``VmHWM``, reset through ``/proc/self/clear_refs``: Linux)
above the resident set before it (``VmRSS``), on CUDA ``max_memory_allocated`` above the memory
allocated before it.

    python benchmarks/scoring_memory.py --out benchmarks/scoring_memory.json
    python benchmarks/scoring_memory.py --device cuda --out /tmp/scoring_memory_cuda.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
ROWS = ("batched_with_entropy", "rows_no_entropy")  # the baseline first


def _status_kib(field: str) -> int:
    """``VmRSS`` (resident now) or ``VmHWM`` (its peak since the last reset) of this process, KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def pass_peak_mib(call, device: torch.device):
    """``call()`` and the memory it took at its peak above what was in use before it, MiB: on CUDA
    ``max_memory_allocated`` above ``memory_allocated``; on the CPU the resident set's high-water
    mark during the call (``VmHWM``, reset to ``VmRSS`` through ``/proc/self/clear_refs``) above the
    resident set before it, not above the process's peak so far (loading the model set that)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = call()
        torch.cuda.synchronize()
        return out, (torch.cuda.max_memory_allocated() - start) / 2**20
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = _status_kib("VmRSS")
    out = call()
    return out, (_status_kib("VmHWM") - start) / 1024


def write_model(directory: Path, vocab: int) -> None:
    """The tiny Qwen2 checkpoint, its embeddings and head padded to ``vocab`` rows."""
    from transformers import AutoModelForCausalLM

    from policies.causal_lm.tiny import write_tiny_checkpoint

    write_tiny_checkpoint(directory, seed=0)
    model = AutoModelForCausalLM.from_pretrained(directory)
    model.resize_token_embeddings(vocab, mean_resizing=False)
    model.save_pretrained(directory)


def measure(row: str, args: argparse.Namespace) -> dict:
    """One row, in this process: peak MiB above the start of the first pass, and the seconds of
    ``args.repeats`` passes after it."""
    from tensordict import TensorDict

    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from vla_rl_core import keys

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(args.model), max_prompt_length=args.prompt,
                                                           max_response_length=args.response), device).eval()
    generator = torch.Generator().manual_seed(0)
    batch = TensorDict({keys.INPUT_IDS: torch.randint(3, 100, (args.batch, args.prompt), generator=generator),
                        keys.ATTENTION_MASK: torch.ones(args.batch, args.prompt, dtype=torch.long),
                        keys.RESPONSES: torch.randint(3, 100, (args.batch, args.response), generator=generator),
                        keys.RESPONSE_MASK: torch.ones(args.batch, args.response, dtype=torch.bool)},
                       batch_size=[args.batch]).to(device)
    inputs = (batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.RESPONSES], batch[keys.RESPONSE_MASK])

    def score() -> torch.Tensor:
        with torch.no_grad():
            if row == "batched_with_entropy":
                return policy.log_probs_and_entropy(*inputs)[0]
            return policy.log_probs(*inputs)

    log_probs, peak = pass_peak_mib(score, device)
    seconds = []
    for _ in range(args.repeats):
        begin = time.perf_counter()
        score()
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - begin)
    return {"peak_mib": peak, "seconds": seconds, "log_probs_sum": float(log_probs.double().sum())}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--batch", type=int, default=2, help="responses per pass (trainer.micro_batch_size)")
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--response", type=int, default=256, help="response tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--row", choices=ROWS, help=argparse.SUPPRESS)  # one row, in a child process
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: this machine has no CUDA device torch can use; use --device cpu")
    if args.row is not None:
        print(json.dumps(measure(args.row, args)))
        return {}
    with tempfile.TemporaryDirectory() as scratch:
        model = Path(scratch) / "lm"
        write_model(model, args.vocab)
        rows = {}
        for row in ROWS:
            command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--row", row,
                       "--model", str(model)]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"row {row} failed:\n{done.stderr[-3000:]}")
            rows[row] = json.loads(done.stdout.strip().splitlines()[-1])
    baseline = rows[ROWS[0]]
    if rows[ROWS[1]]["log_probs_sum"] != baseline["log_probs_sum"]:
        raise SystemExit(f"the rows scored differently: {rows}")
    settings = {key: value for key, value in vars(args).items() if key not in ("row", "model")}
    result = {"settings": {**settings, "out": str(args.out) if args.out else None},
              "machine": {"platform": platform.platform(), "torch": torch.__version__,
                          "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu"},
              "one_float32_logits_mib": args.batch * args.response * args.vocab * 4 / 2**20, "rows": {}}
    print(f"No-gradient scoring of {args.batch} responses of {args.response} tokens, vocabulary {args.vocab}, "
          f"{args.device}")
    print(f"| row | peak MiB | median s | peak / {ROWS[0]} | speed-up over {ROWS[0]} |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        median = statistics.median(row["seconds"])
        record = {**row, "median_s": median, f"peak_ratio_to_{ROWS[0]}": row["peak_mib"] / baseline["peak_mib"],
                  f"speedup_over_{ROWS[0]}": statistics.median(baseline["seconds"]) / median}
        result["rows"][name] = record
        print(f"| {name} | {row['peak_mib']:.0f} | {median:.4f} | {record[f'peak_ratio_to_{ROWS[0]}']:.2f} | "
              f"{record[f'speedup_over_{ROWS[0]}']:.2f}x |")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
