#!/usr/bin/env bash
# Bootstrap, then run the tests. Extra arguments go to pytest: by default the unit and component
# tests; `-m e2e` the end-to-end runs (Ray, the engine, the command line), `-m slow` the long ones.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/python -m pytest "$@"
