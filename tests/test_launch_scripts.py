"""The launch scripts (scripts/train_srpo.sh, train_grpo_llm.sh, eval.sh) run vla-rl in the
directory they are called from: they changed to the checkout first, so relative paths in their
arguments (a run directory, TEMPLATE=./my.yaml, run.output_dir) were read, and results written,
there (found by an audit of docs/cluster.md, which says relative paths are the caller's)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_script(script: str, args: list[str], cwd: Path, **env: str) -> str:
    """stderr of ``bash scripts/<script> ARGS`` called from ``cwd`` (its bootstrap is a no-op on a
    set-up checkout)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VLA_RL_", "TEMPLATE", "MODEL"))}
    done = subprocess.run(["bash", str(REPO / "scripts" / script), *args], cwd=cwd, env={**environ, **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    return done.stderr


@pytest.mark.parametrize("script", ["train_srpo.sh", "train_grpo_llm.sh"])
def test_a_template_path_is_the_callers(script, tmp_path):
    (tmp_path / "mine.yaml").write_text("name: mine\nnodes: [\n")  # broken: read, not "not found"
    err = run_script(script, [], tmp_path, TEMPLATE="./mine.yaml")
    assert err.strip().splitlines()[-1].startswith("error: mine.yaml: invalid YAML at line 3"), err


def test_a_run_directory_path_is_the_callers(tmp_path):
    (tmp_path / "runs" / "x").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "sweep.json").write_text("{}")
    err = run_script("eval.sh", ["runs/x"], tmp_path)
    assert err.strip().splitlines()[-1] == ("error: runs/x is a sweep of seeds: evaluate each of its runs, e.g. "
                                            "vla-rl eval runs/x/seed_<S>"), err
