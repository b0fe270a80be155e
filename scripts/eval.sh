#!/usr/bin/env bash
# Evaluate a training run's checkpoints (or given checkpoint directories) with rollouts, e.g.
#   bash scripts/eval.sh outputs/embodied_srpo_20260101_120000 eval.num_episodes=20
#   bash scripts/eval.sh outputs/<run>/checkpoints/step_00000025 eval.protocols=[greedy]
#   bash scripts/eval.sh --policy-from embodied_srpo_oft_lift policy.config.architecture=null \
#     policy.config.model_path=exported/   # a model directory before training (docs/evaluation.md)
# Writes <run>/eval/: report.md, report.json, success_vs_checkpoint.png, videos/, episodes/ (zarr).
# Running it again continues an interrupted evaluation.
set -euo pipefail
# relative paths in the arguments (run.output_dir, a run directory, TEMPLATE=./my.yaml) are the
# caller's: vla-rl runs in the directory this script was called from
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/vla-rl" eval "$@"
