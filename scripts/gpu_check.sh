#!/usr/bin/env bash
# Is this GPU node ready for vla-rl? Runs the CUDA subset of the suite, short training runs on the
# GPU, EGL rendering and the real-size benchmarks, each part under its own timeout; prints a
# pass/fail table and writes outputs/gpu_check/report.json. Arguments go to scripts/gpu_check.py
# (--parts NAME..., --skip NAME..., --out DIR). Uses $PYTHON if set, else .venv's python if there is
# one, else python3.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  [ -x .venv/bin/python ] && PYTHON=.venv/bin/python
fi
exec "$PYTHON" scripts/gpu_check.py "$@"
