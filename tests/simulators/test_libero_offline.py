"""The LIBERO offline workarounds (skipped, with the reason, where the ``libero`` extra is absent)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from simulators.libero_offline import (
    bundled_assets_dir,
    libero_unavailable_reason,
    prepare_libero_offline,
    write_libero_config,
)

pytestmark = pytest.mark.skipif(libero_unavailable_reason() is not None, reason=str(libero_unavailable_reason()))


def test_config_names_the_package_directories(tmp_path):
    config_file = write_libero_config(tmp_path / "cfg")
    config = yaml.safe_load(config_file.read_text())
    assert set(config) == {"benchmark_root", "bddl_files", "init_states", "datasets", "assets"}
    assert (Path(config["bddl_files"]) / "libero_spatial").is_dir()
    assert (Path(config["init_states"]) / "libero_10").is_dir()
    assert [p.name for p in (tmp_path / "cfg").iterdir()] == ["config.yaml"]  # no temporary file left


def test_prepare_links_assets_and_patches_the_mount():
    from simulators.rendering import setup_headless_rendering

    setup_headless_rendering()
    prepare_libero_offline()
    prepare_libero_offline()  # idempotent
    assert "LIBERO_CONFIG_PATH" in os.environ
    from libero.libero import get_default_path_dict, get_libero_path
    from libero.libero.envs.robots.on_the_ground_panda import OnTheGroundPanda

    assert os.path.realpath(get_default_path_dict()["assets"]) == os.path.realpath(bundled_assets_dir())
    assert Path(get_libero_path("bddl_files")).is_dir()
    assert OnTheGroundPanda().default_base == "NullMount"
