"""docs/extending.md's worked example, run as written: its code blocks become the files they name,
the template imports them with ``run.imports``, bad settings are refused at plan time naming the
field, and one training step uses the toy estimator, loss, encoder and reward on the Ray workers.

In a subprocess, so that the toy components never enter this process's registries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_env
from devices import device_overrides

from vla_rl.dag.loader import REPO_ROOT

pytestmark = pytest.mark.e2e

DOC = REPO_ROOT / "docs" / "extending.md"
TOY_MODULES = ["toy_estimators", "toy_losses", "toy_encoder", "toy_reward", "toy_penalty"]
TOY = [
    f"run.imports=[{','.join(TOY_MODULES)}]",
    "algorithm.adv_estimator=scaled_return", "algorithm.scaled_return.scale=0.5",
    "algorithm.policy_loss=clipped_reinforce", "algorithm.clipped_reinforce.advantage_clip=2",
    "algorithm.reward=proximity", "algorithm.trajectory_encoder=final_state", "algorithm.proximity.scale=0.3",
    "algorithm.filter_groups.zero_variance=false", "algorithm.filter_groups.success_rate_band=null",
]
TINY = ["trainer.total_steps=1", "trainer.ppo_epochs=1", "trainer.ppo_mini_batch_size=6", "data.init_states_per_step=2",
        "data.group_size=3", "simulator.env.horizon=30", "eval.num_episodes=0", "warm_start.bc_steps=20",
        "policy.config.hidden_sizes=[16]", *device_overrides()]


def write_doc_files(directory: Path) -> list[str]:
    """Each ```python or ```yaml block of the doc whose first line is ``# file: NAME`` goes to
    directory/NAME."""
    names = []
    for block in re.findall(r"```(?:python|yaml)\n(.*?)```", DOC.read_text(), flags=re.S):
        first, _, body = block.partition("\n")
        match = re.fullmatch(r"# file: (\S+)", first.strip())
        if match:
            (directory / match.group(1)).write_text(body)
            names.append(match.group(1))
    return names


def cli(args: list[str], directory: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vla_rl.cli", *args], cwd=directory,
                          env=child_env(directory, REPO_ROOT), capture_output=True, text=True, timeout=timeout)


def test_the_documented_components_plug_in_and_train(tmp_path):
    assert write_doc_files(tmp_path) == [*(f"{name}.py" for name in TOY_MODULES[:4]), "point_mass.py",
                                         "linear_gaussian.py", "toy_penalty.py", "toy_penalty.yaml"]
    penalty = str(tmp_path / "toy_penalty.yaml")

    planned = cli(["plan", "embodied_grpo", *TOY], tmp_path, timeout=300)
    assert planned.returncode == 0, planned.stderr[-2000:]
    for bad, field in (("algorithm.scaled_return.scale=-1", "algorithm.scaled_return"),
                       ("algorithm.proximity.scale=2", "algorithm.proximity"),
                       ("algorithm.clipped_reinforce.clip=1", "algorithm.clipped_reinforce.clip")):
        refused = cli(["plan", "embodied_grpo", *TOY, bad], tmp_path, timeout=300)
        assert refused.returncode == 2 and f"field '{field}'" in refused.stderr, refused.stderr[-2000:]
    missing = cli(["plan", "embodied_grpo", "run.imports=[not_a_module]"], tmp_path, timeout=300)
    assert missing.returncode == 2 and "field 'run.imports': cannot import 'not_a_module'" in missing.stderr

    planned = cli(["plan", penalty], tmp_path, timeout=300)  # the doc's template, as written
    assert planned.returncode == 0 and "order: tasks -> rollout -> reward -> length_penalty -> advantage" in \
        planned.stdout, planned.stderr[-2000:]

    out = tmp_path / "runs"  # the doc's template with every toy component, one step
    trained = cli(["train", penalty, *TOY, *TINY, f"run.output_dir={out}", "run.name=toy",
                   f"warm_start.demo_store={tmp_path / 'demos.zarr'}"], tmp_path, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    records = [json.loads(line) for line in (out / "toy" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "rollout/success_rate" in r)
    assert "actor/clipped_fraction" in step and step["actor/num_updates"] == 1.0  # the toy loss trained
    assert 0.0 < step["reward/length_penalty"] <= 0.2 + 1e-6  # the toy node shaped the rewards (float32)
    assert 0.0 <= step["reward/mean"] <= 1.0
    if "reward/failure_mean" in step:  # failures earn scale * exp(-distance) < 0.3, or 0 without a success
        assert 0.0 <= step["reward/failure_mean"] < 0.3
