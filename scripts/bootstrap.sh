#!/usr/bin/env bash
# Set up everything vla-rl needs on a fresh machine (Python 3.11, pip, Debian base), idempotently:
#   - Debian's Mesa EGL libraries for headless MuJoCo rendering, if missing (needs root);
#   - .venv with torch==2.13.0 first (a CPU wheel on the project machines; a bare `torch` would
#     pull a multi-GB CUDA build), then the project with its dependencies, at the exact versions
#     of scripts/constraints-cpu.txt where pyproject.toml gives a range;
#   - optional extras named in VLA_RL_EXTRAS (comma-separated pyproject extras), e.g.
#     `VLA_RL_EXTRAS=libero bash scripts/bootstrap.sh` adds LIBERO and its assets (about 1 GB).
# A torch that .venv already sees and that bootstrap did not install (your CUDA or NPU build) is
# never replaced: if it is in pyproject.toml's range, the rest installs around it (torch,
# torchvision and torchaudio held at their installed versions); if not, bootstrap stops and says
# so. VLA_RL_USE_SYSTEM_TORCH=1 creates .venv with --system-site-packages from PYTHON (default
# python3), so that it uses that interpreter's torch (README, "On a GPU machine"), also when PYTHON
# is a virtual environment's (its site-packages are added to .venv by a .pth file).
# VLA_RL_PIP_DRY_RUN=DIR (for tests): every pip install runs with --dry-run and writes its
# --report to DIR/<step>.json (the torch-keeping constraints to DIR/constraints.txt); nothing is
# installed or recorded, EGL included (.venv is still created if missing).
# A second run is fast: it reinstalls only when pyproject.toml, VLA_RL_EXTRAS or the kept torch
# changed.
set -euo pipefail
cd "$(dirname "$0")/.."

dry_run=${VLA_RL_PIP_DRY_RUN:-}
use_system_torch=${VLA_RL_USE_SYSTEM_TORCH:-0}
if ! [[ "$use_system_torch" =~ ^[01]$ ]]; then
  echo "[bootstrap] VLA_RL_USE_SYSTEM_TORCH must be 0 or 1, got '$use_system_torch'" >&2
  exit 2
fi

if ! ldconfig -p 2>/dev/null | grep -q 'libEGL.so.1'; then
  if [ -z "$dry_run" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "[bootstrap] installing Mesa EGL for headless rendering"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libegl-mesa0 libgl1-mesa-dri >/dev/null
  else
    echo "[bootstrap] warning: libEGL.so.1 not found; camera rendering (videos) will fail" >&2
  fi
fi

if [ "$use_system_torch" = 1 ]; then
  PYTHON=${PYTHON:-python3}
else
  PYTHON=${PYTHON:-python3.11}
  command -v "$PYTHON" >/dev/null || PYTHON=python3
fi
torch_of() { "$1" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null; }
if [ ! -x .venv/bin/python ]; then
  if [ "$use_system_torch" = 1 ]; then
    if ! system_torch=$(torch_of "$PYTHON"); then
      echo "[bootstrap] VLA_RL_USE_SYSTEM_TORCH=1 but $PYTHON has no torch: install your CUDA torch into it first, or set PYTHON to the interpreter that has it" >&2
      exit 2
    fi
    echo "[bootstrap] creating .venv with $("$PYTHON" --version) and its site-packages (torch $system_torch)"
    "$PYTHON" -m venv --system-site-packages .venv
    # A venv made from a virtual environment's interpreter (the GPU image's python3 is
    # /opt/torch/.venv/bin/python3; uv, virtualenv) sees the base interpreter's site-packages, not
    # that environment's: a .pth file adds them after .venv's own, as that environment orders them.
    "$PYTHON" - "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" <<'PY'
import pathlib, site, sys
if sys.prefix != sys.base_prefix:
    pth = pathlib.Path(sys.argv[1]) / "_vla_rl_system_site.pth"
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages()))
    print(f"[bootstrap] {sys.executable} is a virtual environment's: its site-packages are added to .venv by {pth}")
PY
  else
    echo "[bootstrap] creating .venv with $("$PYTHON" --version)"
    if system_torch=$(torch_of "$PYTHON"); then
      echo "[bootstrap] note: $PYTHON has torch $system_torch; VLA_RL_USE_SYSTEM_TORCH=1 (with .venv removed) would use it instead of installing one"
    fi
    "$PYTHON" -m venv .venv
  fi
elif [ "$use_system_torch" = 1 ] && ! grep -Eqi '^include-system-site-packages *= *true' .venv/pyvenv.cfg; then
  echo "[bootstrap] VLA_RL_USE_SYSTEM_TORCH=1 but .venv exists without system site packages: remove it (rm -rf .venv) and run again" >&2
  exit 2
fi

extras=test
if [ -n "${VLA_RL_EXTRAS:-}" ]; then
  if ! [[ "$VLA_RL_EXTRAS" =~ ^[a-z0-9_-]+(,[a-z0-9_-]+)*$ ]]; then
    echo "[bootstrap] VLA_RL_EXTRAS must be comma-separated extra names such as 'libero', got '$VLA_RL_EXTRAS'" >&2
    exit 2
  fi
  extras="test,$VLA_RL_EXTRAS"
fi

# Which torch: "pin" (none yet, or the one bootstrap installed: install CI's pin) or "keep VERSION"
# (anyone else's, in range: write constraints that hold it and install the rest around it).
keep_constraints=$(mktemp)
trap 'rm -f "$keep_constraints"' EXIT
torch_plan=$(.venv/bin/python - "$keep_constraints" <<'PY'
import importlib.metadata as metadata
import pathlib
import re
import sys
import tomllib

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version


def name_of(line):
    return re.sub(r"[-_.]+", "-", Requirement(line).name).lower()


project = tomllib.loads(pathlib.Path("pyproject.toml").read_text())["project"]
torch_range = next(Requirement(d) for d in project["dependencies"] if name_of(d) == "torch").specifier
try:
    torch = metadata.distribution("torch")
except metadata.PackageNotFoundError:
    print("pin")
    sys.exit()
version = torch.version
location = pathlib.Path(torch.locate_file("")).resolve()
in_venv = location.is_relative_to(pathlib.Path(sys.prefix).resolve())
record = pathlib.Path(".venv/.vla_rl_torch")  # the torch version bootstrap installed
if record.exists():
    ours = in_venv and record.read_text().strip() == version
else:  # a .venv of the bootstrap before the record: it installed the CPU pin itself
    ours = in_venv and pathlib.Path(".venv/.vla_rl_installed").exists() and Version(version).local == "cpu"
if ours:
    print("pin")
    sys.exit()
if not torch_range.contains(version, prereleases=True):
    print(f"[bootstrap] this environment has torch {version} ({location}), outside vla-rl's range "
          f"torch{torch_range}; bootstrap does not replace a torch it did not install: install a torch "
          "in range (your CUDA build of it), or remove this one (or .venv) to get CI's CPU pin",
          file=sys.stderr)
    sys.exit(2)
held = ["torch", "torchvision", "torchaudio"]
lines = [line for line in pathlib.Path("scripts/constraints-cpu.txt").read_text().splitlines()
         if not line.strip() or line.lstrip().startswith("#") or name_of(line) not in held]
for name in held:
    try:
        lines.append(f"{name}=={metadata.version(name)}")
    except metadata.PackageNotFoundError:
        pass
pathlib.Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
print(f"keep {version}")
PY
)

pip_install() {  # pip_install STEP ARGS...: pip install ARGS, or its dry run under VLA_RL_PIP_DRY_RUN
  local step=$1
  shift
  if [ -n "$dry_run" ]; then
    .venv/bin/python -m pip install -q --dry-run --report "$dry_run/$step.json" "$@"
  else
    .venv/bin/python -m pip install -q "$@"
  fi
}

stamp=.venv/.vla_rl_installed
want="$(cat pyproject.toml scripts/constraints-cpu.txt | sha256sum | cut -d' ' -f1) $extras"
[ "$torch_plan" = pin ] || want="$want $torch_plan"
if [ -n "$dry_run" ] || [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] installing dependencies (a few minutes the first time)"
  if [ -n "$dry_run" ]; then
    mkdir -p "$dry_run"
  else
    .venv/bin/python -m pip install -q --upgrade pip
  fi
  if [ "$torch_plan" = pin ]; then
    pip_install torch -c scripts/constraints-cpu.txt torch
    pip_install project -c scripts/constraints-cpu.txt -e ".[$extras]"
  else
    echo "[bootstrap] keeping this environment's torch ${torch_plan#keep } (CI pins $(grep -E '^torch[=<>!~ ]' scripts/constraints-cpu.txt)); the rest at scripts/constraints-cpu.txt's versions"
    [ -z "$dry_run" ] || cp "$keep_constraints" "$dry_run/constraints.txt"
    pip_install project -c "$keep_constraints" -e ".[$extras]"
  fi
  if [ -z "$dry_run" ]; then
    if [ "$torch_plan" = pin ]; then
      torch_of .venv/bin/python > .venv/.vla_rl_torch
    else
      rm -f .venv/.vla_rl_torch
    fi
    echo "$want" > "$stamp"
  fi
fi
