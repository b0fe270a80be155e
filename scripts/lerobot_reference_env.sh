#!/usr/bin/env bash
# Create (idempotently) a separate Python 3.11 venv that has LeRobot's own dataset code
# (PyPI lerobot==0.4.4, dataset format "v3.0") for checking vla-rl's LeRobot files against the
# reference implementation. Usage:
#
#   bash scripts/lerobot_reference_env.sh [VENV_DIR] [--freeze-out FILE]
#
# VENV_DIR defaults to /tmp/lerobot-ref-venv. --freeze-out writes the venv's `pip freeze` to FILE
# (tests/fixtures/lerobot/reference_env_freeze.txt holds the one the fixtures were made with).
# Use it offline and on CPU:
#
#   HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 VENV_DIR/bin/python tests/fixtures/lerobot/check_with_lerobot.py ROOT EXPECTED.npz
#
# Why a separate venv: lerobot 0.4.4 pins torch<2.11 and huggingface-hub<0.36, the project uses
# torch 2.13 and transformers 5 / huggingface-hub 2.x. So lerobot is installed with --no-deps and
# only what its dataset code (lerobot.datasets.*, and the lerobot.utils/configs/processor modules
# that it imports) needs is installed, all pinned below, also with --no-deps (pip resolves nothing;
# `pip check` therefore lists lerobot's unmet pins: torch/torchvision/torchcodec versions and the
# robot/training extras, none of which the dataset code imports).
#
# Departures from lerobot's own pins, all checked with the fixtures under tests/fixtures/lerobot/:
# - torch 2.13.0 (CPU wheel, as the project), torchvision 0.28.0 (the release that pins
#   torch==2.13.0), torchcodec 0.13.0 (works with torch>=2.11; 0.14/0.15 on PyPI link CUDA libs).
# - PyPI's torchvision 0.28.0 is a CUDA build: its C extension (_C.so, the detection ops) cannot
#   load next to the CPU torch. torchvision's Python side works without it except for two
#   register_fake("torchvision::nms"/"qnms") calls at import, so a tiny shim
#   (site-packages/_lerobot_ref_tv_shim.py, loaded by a .pth) defines those two op schemas before
#   torchvision is first imported, only when _C.so does not load. LeRobot's dataset code uses only
#   torchvision's pure-Python transforms. Consequence: LeRobot's "pyav" video backend, which needs
#   torchvision.io.VideoReader (gone from torchvision >= 0.24), cannot work; the default backend,
#   torchcodec, is used.
# - numpy 2.3.5, not 2.4: with numpy 2.4 datasets' Value.encode_example calls float() on the
#   (1,)-shaped arrays that LeRobotDataset.add_frame gets for shape-(1,) float features, which
#   numpy 2.4 rejects ("only 0-dimensional arrays can be converted to Python scalars").
# - torchcodec decodes with the system's FFmpeg shared libraries (4 to 8). When none is found
#   and this runs as root with apt-get, Debian's `ffmpeg` package is installed (about 90
#   packages); set LEROBOT_REF_NO_APT=1 to skip that (then only datasets without videos load).
#   Encoding (lerobot's writer) uses PyAV's bundled FFmpeg (libsvtav1, libx264, hevc).
set -euo pipefail

venv=/tmp/lerobot-ref-venv
freeze_out=
while [ $# -gt 0 ]; do
  case "$1" in
    --freeze-out) freeze_out=${2:?--freeze-out needs a file}; shift 2 ;;
    --freeze-out=*) freeze_out=${1#*=}; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    -*) echo "[lerobot-ref] unknown option $1" >&2; exit 2 ;;
    *) venv=$1; shift ;;
  esac
done
python=${PYTHON:-python3.11}
log() { echo "[lerobot-ref] $*"; }

# Exact versions (Python 3.11, linux x86_64), installed with --no-deps in this order.
torch_pins="torch==2.13.0"
pins="
lerobot==0.4.4
torchvision==0.28.0
torchcodec==0.13.0
numpy==2.3.5
datasets==4.8.5
huggingface-hub==0.35.3
hf-xet==1.8.0
pyarrow==26.0.1
pandas==3.1.1
python-dateutil==4.0.0
tzdata==2026.6
av==15.1.0
pillow==13.0.0
accelerate==1.15.0
psutil==7.2.2
safetensors==0.8.0
draccus==0.10.0
mergedeep==1.3.4
pyyaml-include==1.4.1
toml==0.10.2
typing-inspect==0.9.0
mypy_extensions==1.2.0
PyYAML==6.0.4
jsonlines==4.0.0
attrs==26.1.0
packaging==25.0
fsspec==2026.2.0
aiohttp==3.14.5
aiohappyeyeballs==2.7.1
aiosignal==1.4.0
frozenlist==1.8.0
multidict==7.2.1
propcache==0.5.4
yarl==1.25.1
dill==0.4.1
multiprocess==0.70.19
xxhash==4.1.0
tqdm==4.70.1
requests==2.34.2
certifi==2026.10.19.post1
charset-normalizer==3.5.3
idna==3.20
urllib3==2.8.0
httpx==0.28.1
httpcore==1.0.9
h11==0.16.0
anyio==4.16.0
filelock==4.3.1
typing_extensions==4.16.0
sympy==1.14.0
mpmath==1.3.0
networkx==3.6.1
Jinja2==3.1.6
MarkupSafe==3.0.4
"

read -r -d '' shim <<'PYEOF' || true
"""Reference-venv shim, written by vla-rl's scripts/lerobot_reference_env.sh.

PyPI's torchvision 0.28.0 wheel is a CUDA build: its C extension (torchvision/_C.so) links
libtorch_cuda.so and cannot load next to the CPU-only torch 2.13.0 wheel. torchvision's Python
code copes with a missing _C except for two unconditional
torch.library.register_fake("torchvision::nms" / "torchvision::qnms") calls, which need the op
schemas to exist. Right before torchvision is first imported, this defines exactly those two
schemas (as _C.so would), unless _C.so loads. The ops stay unimplemented; LeRobot's dataset code
never calls them. Nothing else changes.
"""
import importlib.abc
import sys


class _DefineTorchvisionOpSchemas(importlib.abc.MetaPathFinder):
    done = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torchvision" or type(self).done:
            return None
        type(self).done = True
        import importlib.machinery
        import os

        import torch

        spec = importlib.machinery.PathFinder.find_spec("torchvision")
        if spec is None or not spec.submodule_search_locations:
            return None
        so = os.path.join(list(spec.submodule_search_locations)[0], "_C.so")
        try:
            torch.ops.load_library(so)  # a working (CPU) torchvision: nothing to do
        except (ImportError, OSError):
            global _LIB
            _LIB = torch.library.Library("torchvision", "FRAGMENT")
            _LIB.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            _LIB.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        return None  # the normal finders import torchvision


sys.meta_path.insert(0, _DefineTorchvisionOpSchemas())
PYEOF

stamp_text=$(printf '%s\n%s\n%s\n' "$torch_pins" "$pins" "$shim")
stamp_sum=$(printf '%s' "$stamp_text" | sha256sum | cut -d' ' -f1)
stamp=$venv/.vla_rl_lerobot_ref_stamp

smoke() {
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$venv/bin/python" - <<'PYEOF'
import importlib.metadata as md
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset, CODEBASE_VERSION  # noqa: F401
assert torch.version.cuda is None, f"torch {torch.__version__} is a CUDA build"
bad = sorted(d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia"))
assert not bad, f"CUDA packages in the venv: {bad}"
try:
    from torchcodec.decoders import VideoDecoder  # noqa: F401  (loads FFmpeg)
    video = "yes (torchcodec)"
except Exception as exc:  # noqa: BLE001
    video = f"NO: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
print(f"lerobot {md.version('lerobot')} (format {CODEBASE_VERSION}), torch {torch.__version__}, video decoding: {video}")
PYEOF
}

have_ffmpeg_libs() { ldconfig -p 2>/dev/null | grep -Eq 'libavutil\.so\.(5[6-9]|60) '; }

if ! have_ffmpeg_libs; then
  if [ "${LEROBOT_REF_NO_APT:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    log "installing FFmpeg's shared libraries (Debian package ffmpeg) for torchcodec"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends ffmpeg >/dev/null; } \
      || log "warning: could not install ffmpeg; video features will not decode"
  else
    log "warning: no FFmpeg shared libraries (libavutil); datasets with videos will not decode"
  fi
fi

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$stamp_sum" ] && smoke; then
  log "$venv is up to date"
else
  start=$(date +%s)
  if [ ! -x "$venv/bin/python" ]; then
    command -v "$python" >/dev/null || { log "$python not found (set PYTHON to a Python 3.11)"; exit 1; }
    log "creating $venv with $("$python" --version)"
    "$python" -m venv "$venv"
  fi
  "$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
    || { log "$venv is not a Python 3.11 venv; remove it or pass another VENV_DIR"; exit 1; }
  rm -f "$stamp"
  log "installing $torch_pins"
  "$venv/bin/python" -m pip install -q --no-deps "$torch_pins"
  log "installing lerobot 0.4.4 and the dataset code's dependencies (--no-deps, pinned)"
  # shellcheck disable=SC2086
  "$venv/bin/python" -m pip install -q --no-deps $pins
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  printf '%s\n' "$shim" > "$site/_lerobot_ref_tv_shim.py"
  echo "import _lerobot_ref_tv_shim" > "$site/_lerobot_ref_tv_shim.pth"
  smoke
  printf '%s' "$stamp_sum" > "$stamp"
  log "ready in $(( $(date +%s) - start )) s: $venv ($(du -sh "$venv" | cut -f1))"
fi

if [ -n "$freeze_out" ]; then
  "$venv/bin/python" -m pip freeze --all 2>/dev/null | grep -v '^pip==' > "$freeze_out"
  log "wrote $freeze_out"
fi
