"""The checks of a local run on the driver, before Ray starts (vla_rl/preflight/:
check_local_packages, check_simulator): the optional packages its workers import, and the
simulator settings only the simulator library knows. Each is refused in one line naming the
field, exit status 2, nothing created on disk; ``plan`` and runs joining a cluster are not
checked. (The input files, prompts and checkpoints: tests/test_preflight.py.)"""

from __future__ import annotations

import pytest

from vla_rl.cli import main
from vla_rl.dag.loader import load_template
from vla_rl.preflight import PreflightError

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")

TEXT = "llm_grpo"


# ------------------------------------------------------- optional packages of a local run's workers


@pytest.mark.parametrize(("template", "overrides", "module", "field", "message"), [
    ("embodied_srpo_oft_libero", [], "libero", "simulator.name", "LIBERO is not installed"),
    (TEXT, ["text.rollout_backend=vllm"], "vllm", "text.rollout_backend",
     "text.rollout_backend is 'vllm' but the vllm package cannot be imported"),
], ids=["libero", "vllm"])
def test_a_local_run_without_an_optional_package_its_workers_import_is_refused(template, overrides, module, field,
                                                                               message, tmp_path, capsys):
    """Found by every worker after it started before (LIBERO after 21 s, vLLM after 2 min, as Ray
    tracebacks); now refused before Ray starts. ``plan`` still plans it (the run may be meant for
    another machine), and a run joining a cluster is left to the cluster's environment."""
    import importlib.util

    from vla_rl.preflight import check_local_packages

    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    runs = tmp_path / "runs"
    assert main(["train", template, *overrides, f"run.output_dir={runs}"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"field {field!r}: {message}" in errors[0], errors
    assert not runs.exists()
    assert main(["plan", template, *overrides]) == 0
    config = load_template(template, [*overrides, "workers.ray_address=10.0.0.1:6379"]).config
    check_local_packages(config)  # not checked: the cluster's workers may have it
    with pytest.raises(PreflightError, match=message):
        check_local_packages(load_template(template, overrides).config)


# ------------------------------------------------- simulator settings only the simulator knows


@pytest.mark.parametrize(("overrides", "field", "message"), [
    (["simulator.env.obs_keys=[robot0_eef_pos,cube_poss]"], "simulator.env.obs_keys",
     "['cube_poss'] not an observation of Lift; available: ['cube_pos',"),
    (["simulator.env.cameras=[agentview,eye]"], "simulator.env.cameras", "['eye'] not a camera of Lift"),
    (["eval.video_camera=sideveiw"], "eval.video_camera",
     "the evaluation videos' camera 'sideveiw': ['sideveiw'] not a camera of Lift; available: ['frontview',"),
    # the run's own render_camera, with videos on (the default): it was checked only with the
    # videos' camera in its place, and the workers refused it with a Ray traceback, exit 1
    (["simulator.env.render_camera=foo"], "simulator.env.render_camera", "['foo'] not a camera of Lift"),
], ids=["obs_keys", "cameras", "video_camera", "render_camera"])
def test_a_robosuite_name_the_task_lacks_is_refused_before_ray_starts(overrides, field, message, tmp_path, capsys):
    """Found by the simulator actors once the workers had started before (23 s on the 2-core
    machine, as a Ray traceback; the videos' camera at the first evaluation); now one line
    naming the field, exit status 2, nothing on disk. ``plan`` still plans it (the check needs
    robosuite on the driver), and a run joining a cluster is left to the cluster's workers."""
    from vla_rl.preflight import check_simulator

    runs = tmp_path / "runs"
    assert main(["train", "embodied_srpo", *overrides, f"run.output_dir={runs}"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and f"field {field!r}: {message}" in errors[0], errors
    assert not runs.exists()
    assert main(["plan", "embodied_srpo", *overrides]) == 0
    check_simulator(load_template("embodied_srpo", [*overrides, "workers.ray_address=10.0.0.1:6379"]).config)
    # no videos, no video camera to check
    check_simulator(load_template("embodied_srpo", ["eval.video_camera=sideveiw", "eval.video_episodes=0"]).config)


def test_the_video_camera_of_each_task_of_a_task_set_is_checked():
    """A MetaWorld task set: every task's settings with the videos' camera; MetaWorld's config
    knows its cameras (no build), and the text workflow has no simulator to check."""
    from vla_rl.preflight import check_simulator

    check_simulator(load_template("embodied_srpo_mt10").config)
    with pytest.raises(PreflightError, match="field 'eval.video_camera': the evaluation videos' camera 'agentview'"):
        check_simulator(load_template("embodied_srpo_mt10", ["eval.video_camera=agentview"]).config)
    check_simulator(load_template(TEXT).config)
