#!/usr/bin/env bash
# Set up everything vla-rl needs on a fresh machine (Python 3.11, pip, Debian base), idempotently:
#   - Debian's Mesa EGL libraries for headless MuJoCo rendering, if missing (needs root);
#   - .venv with torch==2.13.0 first (a CPU wheel on the project machines; a bare `torch` would
#     pull a multi-GB CUDA build), then the project with its dependencies, at the exact versions
#     of scripts/constraints-cpu.txt where pyproject.toml gives a range;
#   - optional extras named in VLA_RL_EXTRAS (comma-separated pyproject extras), e.g.
#     `VLA_RL_EXTRAS=libero bash scripts/bootstrap.sh` adds LIBERO and its assets (about 1 GB).
# A second run is fast: it reinstalls only when pyproject.toml or VLA_RL_EXTRAS changed.
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

extras=test
if [ -n "${VLA_RL_EXTRAS:-}" ]; then
  if ! [[ "$VLA_RL_EXTRAS" =~ ^[a-z0-9_-]+(,[a-z0-9_-]+)*$ ]]; then
    echo "[bootstrap] VLA_RL_EXTRAS must be comma-separated extra names such as 'libero', got '$VLA_RL_EXTRAS'" >&2
    exit 2
  fi
  extras="test,$VLA_RL_EXTRAS"
fi

stamp=.venv/.vla_rl_installed
want="$(cat pyproject.toml scripts/constraints-cpu.txt | sha256sum | cut -d' ' -f1) $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] installing dependencies (a few minutes the first time)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -c scripts/constraints-cpu.txt torch
  .venv/bin/python -m pip install -q -c scripts/constraints-cpu.txt -e ".[$extras]"
  echo "$want" > "$stamp"
fi
