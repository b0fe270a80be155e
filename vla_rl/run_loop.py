"""The driver's step loop: ask the workers to run each step, log what they report, checkpoint,
evaluate before and after, and summarise. Only scalar metrics pass through here.

When a worker dies, the driver (:func:`vla_rl.driver.train`) asks :meth:`RunLoop.restart_after`
whether to go on; it starts a fresh group of workers and calls :meth:`RunLoop.run` again as a
resume, which continues from the newest checkpoint that verifies and drops the metrics records
logged after it, so each step is recorded once.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

from tqdm import tqdm

from vla_rl.checkpoints.files import latest_checkpoint
from vla_rl.errors import RunStopped
from vla_rl.run_dir import env_steps_at
from vla_rl.utils.plotting import plot_success_curve
from vla_rl.utils.tracking import MetricsLogger, read_metrics
from vla_rl.workers.dag_worker import ROLLOUT_TIMING
from vla_rl.workers.group import WorkerDiedError, run_evaluation
from vla_rl_core.run_layout import CHECKPOINTS_DIR, METRICS_FILE, SUCCESS_PLOT

TOTAL_ENV_STEPS = "rollout/total_env_steps"
"""Metric: control steps simulated since the start of training (all workers, refills included)."""

DRIVER_BYTES = "driver/bytes"
"""Metric: bytes of the step's replies that reached the driver, all workers together (pickled
scalar metrics: rank 0's, and an empty reply from each other worker)."""


class RunLoop:
    """A run of a template's steps on groups of started workers
    (:class:`~vla_rl.workers.group.WorkerGroup`): the first group, then a fresh one after each
    worker death the run restarts from.

    Metrics of training step ``s`` (0-based) are logged at ``step = s + 1`` (updates done);
    evaluations at the number of updates done when they ran (0 for the first). The held-out
    evaluations run the template's ``evaluate`` phase (when it has one and ``eval.num_episodes >
    0``). The first is named after the policy it sees: ``warm_start`` when the warm-start phase
    trained it, else ``initial`` (``warm_start.num_demos: 0``, ``text.sft_steps: 0``); the summary
    holds it as ``<name>_eval``.
    """

    def __init__(self, template, plan, run_dir: Path, console) -> None:
        self.workers = None
        self.config = template.config
        self.name = template.name
        self.run_dir = run_dir
        self.console = console
        self.evaluates = "evaluate" in plan.phases and self.config.eval.num_episodes > 0
        from vla_rl.dag.registry import WORKFLOWS

        warm = "warm_start" in plan.phases and WORKFLOWS.get(self.config.run.workflow).warm_starts(self.config)
        self.first_tag = "warm_start" if warm else "initial"
        """The name of the evaluation before training (see the class docstring)."""
        self.restarts = 0
        self.restarted_from: list[int] = []
        """The step each restart continued from."""
        self._first: dict = {}  # what the first group did before a restart: start_step, <first_tag>_eval
        # what this command's completed steps took, over its worker groups (a restart's included): the
        # summary's train_time_s and env_steps_per_s (before, a restarted group's own beside all steps_run)
        self._spent = {"train_time_s": 0.0, "rollout_s": 0.0, "env_steps": 0.0}

    def run(self, workers, resume: bool) -> dict:
        """Set the workers up (warm start, or restore the newest checkpoint that verifies), train,
        evaluate; returns the summary. Called again with a fresh group after a restart
        (``resume`` True): the summary then keeps the first group's start and warm-start figures.

        Raises:
            WorkerDiedError: a worker died (the driver decides whether to restart).
        """
        self.workers = workers
        cfg = self.config
        setup = self.workers.call("setup", resume)[0]
        start = int(setup.pop("start_step"))
        skipped = int(setup.pop("skipped_checkpoints", 0))
        recorded_env_steps = setup.pop("env_steps", None)  # the checkpoint's count (None: an older checkpoint)
        if skipped:
            self.console.print(f"[yellow]{skipped} newer checkpoint(s) failed verification and were set aside as "
                               "step_*.rejected (the workers' log says why)[/yellow]")
        if resume:
            self.console.print(f"resuming from the checkpoint of step {start}")
        rendering = self.workers.rendering()
        if any(rendering):
            from simulators.rendering import describe_renderers

            self.console.print(f"simulator rendering: {describe_renderers([r for rank in rendering for r in rank])}")
        if len(self.restarted_from) < self.restarts:
            self.restarted_from.append(start)
        self._first.setdefault("start_step", start)
        logger = MetricsLogger(self.run_dir, resume_step=start if resume else None)
        summary: dict = {"template": self.name, "run_dir": str(self.run_dir), "start_step": self._first["start_step"]}
        if any(rendering):
            summary["rendering"] = rendering  # per rank, per simulator actor
        if self.restarts:
            summary.update(restarts=self.restarts, restarted_from_steps=list(self.restarted_from))
        first = f"{self.first_tag}_eval"
        if resume and first not in self._first and self.evaluates:  # the run's own, from before the resume
            self._first.update(self._logged_first_evaluation(first))
        if first in self._first:
            summary[first] = self._first[first]
        try:
            if setup:
                logger.log(0, setup)
            if not resume and self.evaluates:
                what = "warm-start" if self.first_tag == "warm_start" else "initial (not warm-started)"
                self.console.print(f"evaluating the {what} policy on {self._held_out} ...")
                summary[first] = run_evaluation(self.workers, 0, self.first_tag, True)
                self._first[first] = summary[first]
                logger.log(0, summary[first])
            summary.update(self._train(start, logger, self._resumed_env_steps(start, recorded_env_steps) if resume
                                       else 0.0))
            summary["steps_run"] = summary["last_step"] - summary["start_step"]  # a re-run step counts once
            if self.evaluates and summary["last_step"] == 0 and summary.get(first):
                # no update since the first evaluation (trainer.total_steps=0: evaluating a model as it
                # is): the same policy, so its figures are the final ones, not a second draw of them
                self.console.print("no training step ran: the final evaluation is the first one")
                summary["final_eval"] = summary[first]
            elif self.evaluates:
                self.console.print(f"evaluating the trained policy on {self._held_out} ...")
                summary["final_eval"] = run_evaluation(self.workers, summary["last_step"], "final", True)
                logger.log(summary["last_step"], summary["final_eval"])
        finally:
            logger.close()
        if summary.get(first) and summary.get("final_eval"):
            for protocol in cfg.eval.protocols:
                key = f"eval/{protocol}/success_rate"
                gain = summary["final_eval"][key] - summary[first][key]
                summary[f"improvement_points/{protocol}"] = 100 * gain
        records = read_metrics(self.run_dir / METRICS_FILE)
        plot_success_curve(records, self.run_dir / SUCCESS_PLOT, f"{self.name}: success rate")
        self._print_summary(summary)
        return summary

    def restart_after(self, died: WorkerDiedError) -> None:
        """Decide what follows a worker's death (its group is already killed): return to restart
        from the last checkpoint, or end the run.

        Restarting the whole group, not only the dead actor (a Ray actor restart), is what keeps
        the run consistent: the survivors are inside a step, blocked in (or failed out of) a
        gloo collective with the dead rank, and a torch.distributed process group cannot take a
        new member in place of a dead one. A fresh group forms a new process group and restores
        every rank's weights, optimizer and RNG states from one checkpoint, so the run goes on
        exactly as if it had been resumed there (and as if it had never stopped).

        Raises:
            RunStopped: ``workers.max_restarts`` restarts are used up, or no checkpoint exists
                yet; the message names the rank, the error and the command that resumes the run.
        """
        max_restarts = self.config.workers.max_restarts
        checkpoint = latest_checkpoint(self.run_dir / CHECKPOINTS_DIR)
        if checkpoint is not None and self.restarts < max_restarts:
            self.restarts += 1
            self.console.print(f"[bold yellow]{died}[/bold yellow]\nrestarting the workers from the last checkpoint "
                               f"(restart {self.restarts} of workers.max_restarts={max_restarts})")
            return
        used = f"after {self.restarts} restart(s) (workers.max_restarts={max_restarts})"
        what = str(died).rstrip(".")
        if checkpoint is None:
            raise RunStopped(f"{what}. The run stopped {used}; it wrote no checkpoint yet, so it cannot be resumed: "
                             f"start it again under another run.name, or remove {shlex.quote(str(self.run_dir))} "
                             f"first (a checkpoint is written every trainer.save_every="
                             f"{self.config.trainer.save_every} steps)") from died
        raise RunStopped(f"{what}. The run stopped {used}; its last checkpoint is {checkpoint.name}. Resume it with: "
                         f"vla-rl train --resume {shlex.quote(str(self.run_dir))}") from died

    @property
    def _held_out(self) -> str:
        """What the run's evaluations roll out, for its console lines."""
        return "held-out initial states" if self.config.run.workflow == "embodied" else "held-out prompts"

    def _logged_first_evaluation(self, first: str) -> dict:
        """``{first: figures}`` of the evaluation the run logged at step 0 before it was resumed
        (its summary's ``warm_start_eval`` / ``initial_eval``, and the improvement the summary and
        a seed sweep's report compute from it), or ``{}`` without one."""
        key = f"eval/{self.config.eval.protocols[0]}/success_rate"
        logged = [record for record in read_metrics(self.run_dir / METRICS_FILE)
                  if record.get("step") == 0 and key in record]
        return {first: {k: v for k, v in logged[0].items() if k != "step"}} if logged else {}

    def _resumed_env_steps(self, start: int, recorded: float | None) -> float:
        """The environment steps simulated by the resumed checkpoint's step ``start``: the count
        the checkpoint records; for a checkpoint written before checkpoints recorded it, the last
        ``rollout/total_env_steps`` of ``metrics.jsonl`` up to ``start``. Where the two differ
        (metric lines lost, e.g. a machine crash after the checkpoint was synced), the
        checkpoint's count is kept and a warning says so: before, the lost steps' environment
        steps were silently missing from the count and the ``trainer.total_env_steps`` budget."""
        logged = env_steps_at(self.run_dir / METRICS_FILE, start)
        if recorded is None:
            return logged
        if self.config.run.workflow == "embodied" and abs(logged - recorded) > 0.5:
            self.console.print(f"[yellow]{self.run_dir / METRICS_FILE} gives {logged:.0f} environment steps by "
                               f"step {start}, its checkpoint {recorded:.0f}: metric lines were lost; the count "
                               "continues from the checkpoint's[/yellow]")
        return recorded

    def _train(self, start: int, logger: MetricsLogger, env_steps: float) -> dict:
        """Run steps ``start ..`` until ``trainer.total_steps`` or the ``trainer.total_env_steps``
        budget; ``env_steps`` is what earlier steps simulated.

        The workers start the next step before the driver logs this one (tensorboard's scalars
        take about a millisecond per step), unless an evaluation or a checkpoint comes between.
        """
        cfg = self.config
        total, budget = cfg.trainer.total_steps, cfg.trainer.total_env_steps
        last_step = start
        train_start = mark = time.perf_counter()
        if budget is not None and env_steps >= budget:  # a resume of a run stopped in its final evaluation
            self.console.print(f"environment-step budget already reached: {env_steps:.0f} >= "
                               f"trainer.total_env_steps={budget}; no training step runs")
            total = start
        pending, step_start = (self.workers.submit("run_step", start), train_start) if start < total else (None, 0.0)
        with tqdm(range(start, total), initial=start, total=total, desc="training", unit="step",
                  dynamic_ncols=True) as bar:  # closed also when a worker dies
            for step in bar:
                metrics = self.workers.collect(pending)[0]
                metrics["timing/step"] = time.perf_counter() - step_start
                metrics[DRIVER_BYTES] = float(self.workers.last_reply_bytes)
                pending = None
                # + dynamic sampling's refill rounds, whose rollout seconds timing/env_interact holds too
                step_env_steps = metrics.get("rollout/env_steps", 0.0) + metrics.get("filter/refill_env_steps", 0.0)
                if metrics.get(ROLLOUT_TIMING):
                    metrics["rollout/env_steps_per_s"] = step_env_steps / metrics[ROLLOUT_TIMING]
                env_steps += step_env_steps
                self._spent["env_steps"] += step_env_steps
                self._spent["rollout_s"] += metrics.get(ROLLOUT_TIMING, 0.0)
                if cfg.run.workflow == "embodied":  # a text run simulates nothing: no environment steps to count
                    metrics[TOTAL_ENV_STEPS] = env_steps
                last_step = step + 1
                out_of_budget = budget is not None and env_steps >= budget
                evaluate = self._evaluate_now(last_step, out_of_budget)
                save = last_step % cfg.trainer.save_every == 0 or last_step == total or out_of_budget
                if not (evaluate or save):  # the workers start the next step while this one is logged
                    pending, step_start = self.workers.submit("run_step", last_step), time.perf_counter()
                logger.log(last_step, metrics)
                bar.set_postfix(progress_postfix(metrics))
                if evaluate:  # before the checkpoint: it saves the RNG states after
                    logger.log(last_step, run_evaluation(self.workers, last_step, f"step_{last_step}", False))
                if save:  # with the count a resume continues from (metrics.jsonl may lose its last lines)
                    self.workers.call("save_checkpoint", last_step, {"env_steps": env_steps})
                self._spent["train_time_s"] += time.perf_counter() - mark  # the step, its evaluation and checkpoint
                mark = time.perf_counter()
                if out_of_budget:
                    self.console.print(f"environment-step budget reached: {env_steps:.0f} >= "
                                       f"trainer.total_env_steps={budget}")
                    break
                if pending is None and last_step < total:
                    pending, step_start = self.workers.submit("run_step", last_step), time.perf_counter()
        spent = self._spent
        return {
            "steps_run": last_step - start,
            "last_step": last_step,
            "train_time_s": spent["train_time_s"],
            "env_steps": env_steps,
            "env_steps_per_s": spent["env_steps"] / spent["rollout_s"] if spent["rollout_s"] else 0.0,
        }

    def _evaluate_now(self, last_step: int, out_of_budget: bool) -> bool:
        """Whether ``eval.every_steps`` asks for a held-out evaluation after ``last_step`` updates
        (the one after the last step is the final evaluation)."""
        ev = self.config.eval
        return (self.evaluates and ev.every_steps is not None and last_step % ev.every_steps == 0
                and last_step < self.config.trainer.total_steps and not out_of_budget)

    def _print_summary(self, summary: dict) -> None:
        if any(summary.get(tag) for tag in (f"{self.first_tag}_eval", "final_eval")):
            self._print_evaluations(summary)
        else:  # an empty table said nothing
            self.console.print("no held-out evaluation (eval.num_episodes=0, or no evaluation phase in the template)")
        env_rate = summary.get("env_steps_per_s", 0)  # 0 for text runs: no simulator
        self.console.print(f"steps run {summary.get('steps_run', 0)}, training time "
                           f"{summary.get('train_time_s', 0):.0f} s, "
                           + (f"{env_rate:.0f} env steps/s during rollouts; " if env_rate else "")
                           + f"plot {self.run_dir / 'success_rate.png'}")

    def _print_evaluations(self, summary: dict) -> None:
        """The held-out evaluations' table and each protocol's gain over the first evaluation."""
        from rich.table import Table

        tasks = self._task_names()
        table = Table(title=f"{self.name} — held-out evaluation" + (f" ({len(tasks)} tasks)" if len(tasks) > 1 else ""))
        columns = ("policy", "task", "protocol", "success", "95% CI (Wilson)", "episodes", "mean length")
        for column in columns if len(tasks) > 1 else [c for c in columns if c != "task"]:
            # A narrow console (80 columns where stdout is not a terminal) folds a long task name
            # onto more lines, never cuts it ("pick-place-w…"); the figures are never wrapped.
            if column == "task":
                table.add_column(column, overflow="fold", min_width=min(max(map(len, tasks)), 40))
            else:
                table.add_column(column, no_wrap=True)
        for tag in (f"{self.first_tag}_eval", "final_eval"):
            ev = summary.get(tag)
            if not ev:
                continue
            for protocol in self.config.eval.protocols:
                for task in ([*tasks, "overall"] if len(tasks) > 1 else [None]):
                    p = f"eval/{protocol}" if task in (None, "overall") else f"eval/{task}/{protocol}"
                    if p + "/success_rate" not in ev:
                        continue
                    cells = [f"{ev[p + '/success_rate']:.1%}", f"[{ev[p + '/ci_low']:.1%}, {ev[p + '/ci_high']:.1%}]",
                             f"{ev[p + '/episodes']:.0f}", f"{ev[p + '/episode_length']:.1f}"]  # text: <= test rows
                    table.add_row(tag.removesuffix("_eval"), *([task] if task else []), protocol, *cells)
        self.console.print(table)
        over = "the warm start" if self.first_tag == "warm_start" else "the initial policy"
        for protocol in self.config.eval.protocols:
            gain = summary.get(f"improvement_points/{protocol}")
            if gain is not None:
                self.console.print(f"{protocol}: {gain:+.1f} percentage points over {over}")

    def _task_names(self) -> list[str]:
        """The tasks of the held-out evaluation (an embodied run's own, or its benchmark's)."""
        if self.config.run.workflow != "embodied":
            return [""]
        from vla_rl.evaluation.benchmarks import resolve_tasks

        return [task.name for task in resolve_tasks(self.config)]


#: The progress bar's figures of a step (name: metric), those the step logged.
PROGRESS_FIGURES = {"success": "rollout/success_rate", "reward": "reward/mean", "loss": "sft/loss"}


def progress_postfix(metrics: dict[str, float]) -> dict[str, str]:
    """The training bar's postfix for a step's ``metrics``: each of :data:`PROGRESS_FIGURES` the
    step logged (a supervised step: its loss; an RL step: its success rate and mean reward)."""
    return {name: f"{metrics[key]:.2f}" for name, key in PROGRESS_FIGURES.items() if key in metrics}
