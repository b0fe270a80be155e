"""The driver's step loop names the evaluation before training after the policy it sees, and its
summary lists every task of a task set."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.run_loop import RunLoop


def loop(template: str, *overrides: str, console=None) -> RunLoop:
    loaded = load_template(template, list(overrides))
    return RunLoop(loaded, plan(loaded), run_dir=Path("runs/x"), console=console or Console())


@pytest.mark.parametrize(("template", "overrides", "tag"), [
    ("embodied_srpo", [], "warm_start"),
    ("embodied_grpo", ["warm_start.num_demos=0"], "initial"),  # a random policy is no warm start
    ("llm_grpo", [], "warm_start"),
    ("llm_grpo", ["text.sft_steps=0"], "initial"),
])
def test_the_first_evaluation_is_named_after_the_policy_it_sees(template, overrides, tag):
    assert loop(template, *overrides).first_tag == tag


def test_the_summary_lists_every_task_and_the_overall_rate():
    console = Console(record=True, width=200)
    run = loop("embodied_grpo_mt10", "simulator.tasks=[reach-v3,push-v3]", "data.init_states_per_step=2",
               "warm_start.num_demos=0", "eval.protocols=[greedy]", console=console)
    figures = {"success_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5, "episodes": 40.0, "episode_length": 90.0}
    evaluation = {f"eval/{task}greedy/{name}": value for task in ("", "reach-v3/", "push-v3/")
                  for name, value in figures.items()}
    run._print_summary({"initial_eval": evaluation, "final_eval": evaluation, "improvement_points/greedy": 0.0})
    text = console.export_text()
    for task in ("reach-v3", "push-v3", "overall"):
        assert f"│ initial │ {task}" in text and f"│ final   │ {task}" in text
    assert "over the initial policy" in text and "warm_start" not in text


@pytest.mark.parametrize("width", [80, 200])
def test_the_summary_never_cuts_a_task_name(width):
    """80 columns is rich's width where stdout is not a terminal (a log file, CI)."""
    from vla_rl.evaluation.benchmarks import resolve_tasks

    console = Console(record=True, width=width)
    run = loop("embodied_grpo_mt10", "warm_start.num_demos=0", console=console)
    tasks = [task.name for task in resolve_tasks(run.config)]
    assert max(map(len, tasks)) >= 20  # e.g. button-press-topdown-v3
    figures = {"success_rate": 0.25, "ci_low": 0.1, "ci_high": 0.5, "episodes": 40.0, "episode_length": 90.0}
    evaluation = {f"eval/{task}greedy/{name}": value for task in ("", *(f"{t}/" for t in tasks))
                  for name, value in figures.items()}
    run._print_summary({"initial_eval": evaluation, "final_eval": evaluation})
    text = console.export_text()
    assert "…" not in text
    for task in tasks:
        assert f" {task} " in text, task
    assert "[10.0%, 50.0%]" in text


def test_the_summary_gives_each_rows_episode_count():
    """A text run evaluates min(eval.num_episodes, test rows) prompts: the title said
    eval.num_episodes (500) where 250 were evaluated."""
    console = Console(record=True, width=120)
    run = loop("llm_grpo", "eval.num_episodes=500", console=console)
    figures = {"success_rate": 0.5, "ci_low": 0.44, "ci_high": 0.56, "episodes": 250.0, "episode_length": 40.0}
    evaluation = {f"eval/{p}/{name}": value for p in run.config.eval.protocols for name, value in figures.items()}
    run._print_summary({"warm_start_eval": evaluation, "final_eval": evaluation})
    text = console.export_text()
    assert "500" not in text and "│ 250 " in text


def test_a_run_without_evaluations_says_so_instead_of_an_empty_table():
    console = Console(record=True, width=200)
    loop("embodied_srpo", "eval.num_episodes=0", console=console)._print_summary({"steps_run": 1})
    text = console.export_text()
    assert "no held-out evaluation (eval.num_episodes=0" in text and "held-out evaluation\n" not in text
    assert "95% CI" not in text and "steps run 1" in text


class _Workers:
    """Stands in for a started worker group that has nothing to set up."""

    def call(self, method, *args):
        assert method == "setup"
        return [{"start_step": 0}]

    def rendering(self):
        return [[]]


@pytest.mark.parametrize(("steps", "evaluations"), [(0, ["warm_start"]), (2, ["warm_start", "final"])])
def test_a_run_of_no_step_evaluates_its_policy_once(steps, evaluations, tmp_path, monkeypatch):
    """``trainer.total_steps=0`` (evaluating an exported model, docs/evaluation.md) evaluated the
    same policy twice, the second time as "final" with other sampled episodes."""
    import vla_rl.run_loop as run_loop

    done = []

    def evaluation(workers, step, tag, record):
        done.append(tag)
        rate = 0.5 if tag == "warm_start" else 0.75
        return {f"eval/{protocol}/{name}": value for protocol in ("greedy", "sampled") for name, value in
                {"success_rate": rate, "ci_low": 0.1, "ci_high": 0.9, "episodes": 8.0, "episode_length": 9.0}.items()}

    monkeypatch.setattr(run_loop, "run_evaluation", evaluation)
    monkeypatch.setattr(run_loop, "plot_success_curve", lambda *args: None)
    loaded = load_template("llm_grpo", [f"trainer.total_steps={steps}"])
    run = RunLoop(loaded, plan(loaded), run_dir=tmp_path, console=Console(record=True, width=200))
    monkeypatch.setattr(run, "_train", lambda start, logger, env_steps: {"last_step": steps})
    summary = run.run(_Workers(), resume=False)
    assert done == evaluations
    assert summary["final_eval"]["eval/greedy/success_rate"] == (0.5 if steps == 0 else 0.75)
    assert summary["improvement_points/greedy"] == (0.0 if steps == 0 else 25.0)
    assert ("no training step ran: the final evaluation is the first one" in run.console.export_text()) == (steps == 0)


def test_the_progress_bar_shows_the_figures_a_step_logged():
    """A supervised step (llm_sft) showed ``reward=nan, success=nan``."""
    from vla_rl.run_loop import progress_postfix

    assert progress_postfix({"sft/loss": 1.2345, "sft/num_updates": 1.0}) == {"loss": "1.23"}
    assert progress_postfix({"rollout/success_rate": 0.5, "reward/mean": 0.25, "actor/loss": 3.0}) == {
        "success": "0.50", "reward": "0.25"}
    assert progress_postfix({}) == {}


def test_a_run_that_died_before_its_first_checkpoint_says_how_to_start_again(tmp_path):
    """It said "start it again", which the existing run directory then refused (it told to resume,
    which has no checkpoint to resume from)."""
    from vla_rl.errors import RunStopped
    from vla_rl.workers.group import WorkerDiedError

    loaded = load_template("embodied_srpo", ["workers.max_restarts=0"])
    run = RunLoop(loaded, plan(loaded), run_dir=tmp_path / "run", console=Console())
    with pytest.raises(RunStopped, match=r"it wrote no checkpoint yet, so it cannot be resumed: start it again under "
                                         rf"another run.name, or remove {tmp_path / 'run'} first"):
        run.restart_after(WorkerDiedError(1, "setup", "killed"))


class _StepWorkers:
    """Stands in for a worker group whose every step logs ``metrics``."""

    def __init__(self, metrics: dict[str, float]) -> None:
        self.metrics, self.last_reply_bytes = metrics, 0

    def submit(self, method, *args):
        return method

    def collect(self, pending):
        assert pending == "run_step"
        return [dict(self.metrics)]

    def call(self, method, *args):
        assert method == "save_checkpoint"


class _Logged:
    def __init__(self) -> None:
        self.lines = []

    def log(self, step, metrics):
        self.lines.append((step, metrics))


def test_dynamic_samplings_refill_steps_count_in_the_throughput_with_their_seconds(tmp_path):
    """The env steps per second divided the first round's and the refill rounds' env steps by the
    first round's seconds: 2,253 / 4.82 s = 467/s for a DAPO run measured at about 155/s."""
    loaded = load_template("embodied_dapo", ["trainer.total_steps=2", "eval.num_episodes=0"])
    run = RunLoop(loaded, plan(loaded), run_dir=tmp_path, console=Console(record=True, width=200))
    # timing/env_interact: the step's rollout seconds, the refill rounds' included (the worker adds them)
    run.workers = _StepWorkers({"rollout/env_steps": 400.0, "filter/refill_env_steps": 1171.0,
                                "timing/env_interact": 10.0})
    logged = _Logged()
    summary = run._train(0, logged, 0.0)
    assert [line["rollout/env_steps_per_s"] for _, line in logged.lines] == [157.1, 157.1]
    assert [line["rollout/total_env_steps"] for _, line in logged.lines] == [1571.0, 3142.0]
    assert summary["env_steps"] == 3142.0 and summary["env_steps_per_s"] == pytest.approx(157.1)
