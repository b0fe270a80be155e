#!/usr/bin/env bash
# Bootstrap, then run the test suite. Extra arguments go to pytest
# (e.g. `bash scripts/test.sh -m slow` for the slow end-to-end runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
