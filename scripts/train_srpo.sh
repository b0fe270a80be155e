#!/usr/bin/env bash
# Train with embodied SRPO on robosuite Lift (CPU by default). Arguments are dotted overrides,
# e.g.  bash scripts/train_srpo.sh trainer.total_steps=5
# Another template: TEMPLATE=embodied_grpo bash scripts/train_srpo.sh
set -euo pipefail
# relative paths in the arguments (run.output_dir, a run directory, TEMPLATE=./my.yaml) are the
# caller's: vla-rl runs in the directory this script was called from
root="$(cd "$(dirname "$0")/.." && pwd)"
bash "$root/scripts/bootstrap.sh"
exec "$root/.venv/bin/vla-rl" train "${TEMPLATE:-embodied_srpo}" "$@"
