#!/usr/bin/env bash
# The wheels vla-rl needs on an offline GPU host that ../shared/gpu's kit does not pack: websockets
# (vla-rl serve, simulator.name: remote), simplejpeg (OpenVLA-OFT's JPEG round trip) and
# openpi-client with its dm-tree (the tests that drive vla-rl serve with openpi's own client). The
# H200 image (2026-11) had neither websockets nor openpi-client nor dm-tree (simplejpeg, added since,
# was not looked for); without them the tests that need them are skipped or fail, and
# scripts/gpu_check.sh names what is missing.
#
#   bash ../shared/gpu/pack.sh .          # the kit, into .gpu/ (networked machine)
#   bash scripts/gpu_kit_wheels.sh        # these wheels, into .gpu/wheels/ (networked machine)
#   bash .gpu/setup.sh                    # on the host: installs .gpu/wheels/*.whl with the kit
#
# Arguments: the kit directory (default .gpu). GPUKIT_PY: the host's Python (default 3.12, as for
# pack.sh). Versions: websockets and simplejpeg as scripts/constraints-cpu.txt pins them, openpi-client as
# pyproject.toml's test extra, dm-tree 0.1.10 (what CI's install resolves to).
set -euo pipefail
cd "$(dirname "$0")/.."
KIT=${1:-.gpu}
PY=${GPUKIT_PY:-3.12}
if [ ! -d "$KIT" ]; then
  echo "gpu_kit_wheels.sh: $KIT does not exist: build the kit first (bash ../shared/gpu/pack.sh .)" >&2
  exit 2
fi
WEBSOCKETS=$(grep -E '^websockets==' scripts/constraints-cpu.txt)
SIMPLEJPEG=$(grep -E '^simplejpeg==' scripts/constraints-cpu.txt)
OPENPI=$(grep -oE 'openpi-client==[0-9.]+' pyproject.toml)
mkdir -p "$KIT/wheels"
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version "$PY" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux1_x86_64 --dest "$KIT/wheels" "$WEBSOCKETS" "$SIMPLEJPEG" "$OPENPI" dm-tree==0.1.10
ls -l "$KIT/wheels"
