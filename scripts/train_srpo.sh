#!/usr/bin/env bash
# Train with embodied SRPO on robosuite Lift (CPU by default). Arguments are dotted overrides,
# e.g.  bash scripts/train_srpo.sh trainer.total_steps=5
# Another template: TEMPLATE=embodied_grpo bash scripts/train_srpo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/vla-rl train "${TEMPLATE:-embodied_srpo}" "$@"
