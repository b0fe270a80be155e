"""GRPO throughput of this project against TRL's ``GRPOTrainer`` on the same work, in one run.

Both train the same tiny Qwen2 checkpoint (:func:`policies.causal_lm.tiny.write_tiny_checkpoint`)
on the same arithmetic prompts, with the same number of prompts per step, group size, response
length, temperature, learning rate and optimizer steps (one per step), on CPU, float32, beta = 0
(no reference model). Samples/s counts sampled responses over the time of the training steps
alone: vla-rl's ``timing/step`` summed over its steps (its final checkpoint, setup, model loading
and the warm start excluded), TRL's own ``train_runtime`` (its training loop; its setup and model
loading excluded, and it saves nothing). The two sides take turns
(``--repeats`` runs each: vla-rl, TRL, vla-rl, TRL, ...), so that both meet the same machine
load; the ratio is that of the medians. Prints a table and writes JSON with every run.

    python benchmarks/llm_grpo_vs_trl.py --steps 20 --repeats 3 --out benchmarks/llm_grpo_vs_trl.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import tempfile
import time
from pathlib import Path


def run_project(model_dir: Path, files: dict, args, out_dir: Path, name: str) -> dict:
    """``llm_grpo`` through the DAG engine; seconds and samples/s of its training loop."""
    from vla_rl.driver import train

    overrides = [
        f"text.model_path={model_dir}", f"text.train_file={files['train']}", f"text.test_file={files['test']}",
        "text.sft_steps=0", "eval.num_episodes=0", f"text.prompts_per_step={args.prompts}",
        f"data.group_size={args.group_size}", f"text.max_response_length={args.response_length}",
        f"trainer.total_steps={args.steps}", "trainer.ppo_epochs=1",
        f"trainer.ppo_mini_batch_size={args.prompts * args.group_size}", f"trainer.lr={args.lr}",
        "algorithm.filter_groups.zero_variance=false", f"workers.num_workers={args.workers}",
        f"workers.torch_threads={args.threads_per_worker}", f"trainer.save_every={args.steps}",
        f"run.output_dir={out_dir}", f"run.name={name}",
    ]
    summary = train("llm_grpo", overrides)
    records = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing/step" in r]
    breakdown = {key: sum(r.get(key, 0.0) for r in steps) for key in steps[0] if key.startswith("timing/")}
    seconds = breakdown["timing/step"]  # the steps: not the final checkpoint's save, which TRL does not make
    return {"seconds": seconds, "samples_per_s": args.steps * args.prompts * args.group_size / seconds,
            "loop_wall_s": summary["train_time_s"],
            "mean_response_length": sum(r["rollout/response_length"] for r in steps) / len(steps),
            "time_breakdown_s": breakdown}


def run_trl(model_dir: Path, files: dict, args, out_dir: Path, name: str) -> dict:
    """TRL 1.16 ``GRPOTrainer`` on the same model, prompts and settings."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from vla_rl.data.prompt_dataset import PromptFile
    from vla_rl.rewards.verifiers import verify

    torch.set_num_threads(args.workers * args.threads_per_worker)
    rows = PromptFile(files["train"]).read_shard(0, 1)
    dataset = Dataset.from_list([{"prompt": r.prompt, "data_source": r.data_source, "ground_truth": r.ground_truth}
                                 for r in rows])

    def reward(completions, data_source, ground_truth, **_):
        return [float(verify(s, c[0]["content"], g).correct) for c, s, g in zip(completions, data_source, ground_truth)]

    config = GRPOConfig(
        output_dir=str(out_dir / name), per_device_train_batch_size=args.prompts * args.group_size,
        num_generations=args.group_size, max_completion_length=args.response_length, temperature=1.0,
        learning_rate=args.lr, beta=0.0, max_steps=args.steps, bf16=False, use_cpu=True, report_to=[],
        logging_steps=1, save_strategy="no", seed=0, dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset,
                          processing_class=tokenizer)
    start = time.perf_counter()
    output = trainer.train()
    wall = time.perf_counter() - start
    seconds = output.metrics["train_runtime"]  # its training loop: not the setup train() makes first
    history = trainer.state.log_history
    lengths = [float(r["completions/mean_length"]) for r in history if "completions/mean_length" in r]
    return {"seconds": seconds, "samples_per_s": args.steps * args.prompts * args.group_size / seconds,
            "train_call_wall_s": wall, "mean_response_length": sum(lengths) / max(len(lengths), 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, taking turns")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--response-length", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--workers", type=int, default=2, help="DAG workers (TRL gets as many torch threads)")
    parser.add_argument("--threads-per-worker", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON record there (default: none; the tables are printed)")
    args = parser.parse_args()
    missing = [name for name in ("trl", "datasets") if importlib.util.find_spec(name) is None]
    if missing:  # before the vla-rl side runs
        parser.exit(2, f"error: TRL's side needs {' and '.join(missing)}: pip install -e '.[trl]'\n")

    from policies.causal_lm.tiny import write_tiny_checkpoint
    from vla_rl.data.arithmetic import write_arithmetic_dataset

    runs: dict[str, list[dict]] = {"vla_rl": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model_dir = write_tiny_checkpoint(tmp / "tiny_model")
        files = write_arithmetic_dataset(tmp / "data", 2000, 64, row_group_size=16)
        for repeat in range(args.repeats):
            runs["vla_rl"].append(run_project(model_dir, files, args, tmp, f"project_{repeat}"))
            runs["trl"].append(run_trl(model_dir, files, args, tmp, f"trl_{repeat}"))
    medians = {side: statistics.median(r["samples_per_s"] for r in side_runs) for side, side_runs in runs.items()}
    result = {"settings": vars(args) | {"out": str(args.out)}, "runs": runs,
              "median_samples_per_s": medians, "ratio": medians["vla_rl"] / medians["trl"]}
    print(f"{'':10s} {'repeat':>6s} {'seconds':>9s} {'samples/s':>10s} {'resp. len':>10s}")
    for side, side_runs in runs.items():
        for repeat, r in enumerate(side_runs):
            print(f"{side:10s} {repeat:6d} {r['seconds']:9.2f} {r['samples_per_s']:10.1f} {r['mean_response_length']:10.1f}")
        print(f"{side:10s} {'median':>6s} {'':9s} {medians[side]:10.1f}")
    print(f"ratio of the medians vla_rl / trl: {result['ratio']:.2f}x")
    by_time = sorted(runs["vla_rl"], key=lambda r: r["seconds"])
    breakdown = by_time[(len(by_time) - 1) // 2]["time_breakdown_s"]
    print("vla_rl time by node, median run (s):", {k: round(v, 2) for k, v in breakdown.items()})
    if args.out is None:
        print("no JSON record written (give --out FILE to keep one)")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
