#!/usr/bin/env bash
# Set up everything vla-rl needs on a fresh machine (Python 3.11, pip, Debian base), idempotently:
#   - Debian's Mesa EGL libraries for headless MuJoCo rendering, if missing (needs root);
#   - .venv with torch==2.13.0 first (a CPU wheel on the project machines; a bare `torch` would
#     pull a multi-GB CUDA build), then the project with its pinned dependencies.
# A second run is fast: it reinstalls only when pyproject.toml changed.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[bootstrap] installing Mesa EGL for headless rendering"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null
  else
    echo "[bootstrap] warning: libEGL.so.1 not found; camera rendering (videos) will fail" >&2
  fi
fi

PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
  echo "[bootstrap] creating .venv with $("$PYTHON" --version)"
  "$PYTHON" -m venv .venv
fi

stamp=.venv/.vla_rl_installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] installing dependencies (a few minutes the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q torch==2.13.0
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
