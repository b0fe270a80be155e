"""The evaluation report, assembled from the episode stores on disk (by the driver): success
rates with Wilson 95% intervals and mean episode lengths per checkpoint, protocol and task, and
over all tasks; written as ``report.json``, ``report.md`` and ``success_vs_checkpoint.png``. Each
planned episode counts once, whatever the stores hold, and the report names the machines those
episodes ran on (:func:`counted_hosts`).

The driver writes it as the evaluation goes (:class:`ReportProgress`): whenever a task has all of
its planned episodes stored, that task's figures go to ``results/<task>.json`` and the report is
written again with every finished task, the tasks skipped before any rollout (with the reason)
and the state of the others; it is written too when a task's state changes otherwise (its first
episodes are stored). An evaluation that fails writes nothing more: it leaves the last report
written, as of the last step that finished, so one that crashes in task ``k`` leaves the report of
tasks ``1 .. k-1`` (task ``k`` ``incomplete`` if a step had stored some of its episodes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from vla_rl.data.trajectory_store import TrajectoryStore
from vla_rl.evaluation.episode_store import (
    STORE_PATTERN,
    EpisodeKey,
    episode_hosts,
    reading_store,
    stored_keys,
    task_dir,
)
from vla_rl.utils.host import describe
from vla_rl.utils.plotting import plot_success_vs_checkpoint
from vla_rl.utils.stats import wilson_interval
from vla_rl_core.file_modes import write_text_atomically
from vla_rl_core.run_layout import RESULTS_DIR, VIDEOS_DIR

OVERALL = "overall"

#: A task's state in the report: all planned episodes stored, some, none yet, or not run at all.
COMPLETE, INCOMPLETE, PENDING, SKIPPED = "complete", "incomplete", "pending", "skipped"


Outcome = tuple[bool, int, bool, dict | None]
"""An episode's ``(success, finish_step, truncated, host)``; ``host``: the record of the machine it
ran on, None where not recorded."""


def _load_task(eval_dir: Path, task: str) -> dict[EpisodeKey, Outcome]:
    """``key -> outcome`` of the committed episodes of a task (first copy kept)."""
    out: dict[EpisodeKey, Outcome] = {}
    for path in sorted(task_dir(eval_dir, task).glob(STORE_PATTERN)):
        with reading_store(path):
            store = TrajectoryStore.open(path, read_only=True)
            d = store.read_scalars() if len(store) else {}
            hosts = episode_hosts(store, d)
        for i in range(len(store)):
            key = EpisodeKey(int(d["checkpoint_step"][i]), bool(d["greedy"][i]), float(d["temperature"][i]),
                             int(d["init_state_id"][i]))
            out.setdefault(key, (bool(d["success"][i]), int(d["finish_step"][i]), bool(d["truncated"][i]), hosts[i]))
    return out


def _counted(eval_dir: Path, tasks, steps: list[int], protocols, init_state_ids: np.ndarray):
    """``(step, protocol, [(task, outcomes), ...])`` for each checkpoint step and protocol, in
    report order: each task's stored outcomes (:func:`_load_task`) of the planned episodes."""
    stored = {task.name: _load_task(eval_dir, task.name) for task in tasks}
    for step in sorted(steps):
        for protocol in protocols:
            keys = [EpisodeKey(step, protocol.greedy, protocol.temperature, int(i)) for i in init_state_ids]
            yield step, protocol, [(task, [stored[task.name][k] for k in keys if k in stored[task.name]])
                                   for task in tasks]


def _row(step: int, protocol: str, task: str, outcomes: list[Outcome]) -> dict:
    n = len(outcomes)
    k = sum(o[0] for o in outcomes)
    low, high = wilson_interval(k, n) if n else (float("nan"), float("nan"))
    return {"checkpoint_step": step, "protocol": protocol, "task": task, "episodes": n, "successes": k,
            "success_rate": k / n if n else float("nan"), "ci_low": low, "ci_high": high,
            "mean_episode_length": float(np.mean([o[1] for o in outcomes])) if n else float("nan"),
            "truncated": sum(o[2] for o in outcomes)}


def summarize(eval_dir: Path, tasks, steps: list[int], protocols, init_state_ids: np.ndarray) -> list[dict]:
    """One row per (checkpoint step, protocol, task) and per (step, protocol) over all tasks
    (``task = "overall"``, the episodes of every task pooled).

    Each row: ``episodes``, ``successes``, ``success_rate``, ``ci_low`` / ``ci_high`` (Wilson 95%,
    :func:`vla_rl.utils.stats.wilson_interval`), ``mean_episode_length`` (decision steps; control
    steps for single-action chunks), ``truncated`` (episodes that hit the time limit).
    Only the planned episodes count, each once; missing ones are simply not counted.
    """
    rows = []
    for step, protocol, per_task in _counted(eval_dir, tasks, steps, protocols, init_state_ids):
        rows += [_row(step, protocol.label, task.name, outcomes) for task, outcomes in per_task]
        if len(per_task) > 1:
            rows.append(_row(step, protocol.label, OVERALL, [o for _, outcomes in per_task for o in outcomes]))
    return rows


def counted_hosts(eval_dir: Path, tasks, steps: list[int], protocols, init_state_ids: np.ndarray) -> dict:
    """The machines of the episodes :func:`summarize` counts: ``{"hosts": [record, ...] (first seen
    first), "host_episodes": [episodes of each], "hosts_unrecorded": episodes whose machine no
    record names (stored by an earlier vla-rl)}``.

    Raises:
        DamagedStoreError: as :func:`~vla_rl.evaluation.episode_store.episode_hosts`.
    """
    records: dict[str, dict] = {}
    episodes: dict[str, int] = {}
    unrecorded = 0
    for *_, per_task in _counted(eval_dir, tasks, steps, protocols, init_state_ids):
        for *_, host in (outcome for _, outcomes in per_task for outcome in outcomes):
            if host is None:
                unrecorded += 1
                continue
            key = json.dumps(host, sort_keys=True)
            records.setdefault(key, host)
            episodes[key] = episodes.get(key, 0) + 1
    return {"hosts": list(records.values()), "host_episodes": list(episodes.values()), "hosts_unrecorded": unrecorded}


def _percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown_table(rows: list[dict]) -> str:
    """The rows as a Markdown table."""
    lines = ["| checkpoint step | protocol | task | success | 95% CI (Wilson) | mean length | episodes |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['checkpoint_step']} | {r['protocol']} | {r['task']} | {_percent(r['success_rate'])} "
                     f"| [{_percent(r['ci_low'])}, {_percent(r['ci_high'])}] | {r['mean_episode_length']:.1f} "
                     f"| {r['episodes']} |")
    return "\n".join(lines)


def planned_keys(steps: list[int], protocols, init_state_ids: np.ndarray) -> set[EpisodeKey]:
    """The episodes an evaluation plans for each task."""
    return {EpisodeKey(step, p.greedy, p.temperature, int(i)) for step in steps for p in protocols
            for i in init_state_ids}


def task_status(eval_dir: Path, task: str, planned: set[EpisodeKey]) -> str:
    """``complete`` (every planned episode of ``task`` is stored), ``incomplete`` (some) or ``pending``."""
    done = len(planned & stored_keys(eval_dir, task))
    return COMPLETE if done == len(planned) else INCOMPLETE if done else PENDING


def hosts_line(info: dict) -> str | None:
    """The report.md line naming the machines the counted episodes ran on, with their number when
    there are several (None: no episode counted; see :func:`counted_hosts`)."""
    named = [(describe(h), n) for h, n in zip(info.get("hosts") or [], info.get("host_episodes") or [], strict=True)]
    if info.get("hosts_unrecorded"):
        named.append(("not recorded (stored by an earlier vla-rl)", info["hosts_unrecorded"]))
    if not named:
        return None
    text = named[0][0] if len(named) == 1 else "; ".join(f"{d} ({n} episode{'s' * (n != 1)})" for d, n in named)
    return (f"- machine{'s' if len(named) > 1 else ''}: {text} (a machine's CPU may change the episodes: "
            "compare evaluations run on the same kind)")


def write_report(eval_dir: Path, protocol_info: dict, rows: list[dict], skipped: list[dict] | None = None,
                 status: dict[str, str] | None = None) -> dict:
    """Write ``report.json``, ``report.md`` and ``success_vs_checkpoint.png`` (atomically).

    Args:
        protocol_info: how the evaluation ran (checkpoints, tasks, protocols, episodes, initial
            states, seed, the machines of the counted episodes: :func:`counted_hosts`), stated in
            both reports.
        rows: from :func:`summarize` (of the finished tasks).
        skipped: the tasks not evaluated, ``{"task", "simulator", "reason"}`` each.
        status: each task's state (:data:`COMPLETE`, ...); None: every task is complete.

    Returns:
        The JSON report.
    """
    skipped = skipped or []
    status = status or {t["name"]: COMPLETE for t in protocol_info["tasks"]}
    replays_file = eval_dir / VIDEOS_DIR / "replays.json"
    videos = json.loads(replays_file.read_text()) if replays_file.exists() else []
    report = {"protocol": protocol_info, "task_status": status, "skipped": skipped, "results": rows,
              "videos": videos}
    _write(eval_dir / "report.json", json.dumps(report, indent=2))
    info = protocol_info
    protocols = ", ".join(p["label"] for p in info["protocols"])
    unfinished = [name for name, state in status.items() if state in (INCOMPLETE, PENDING)]
    if info.get("policy_from"):  # vla-rl eval --policy-from: the template's policy, untrained
        model = (f" (policy.config.model_path {info['model_path']})" if info.get("model_path")
                 else " (no model directory: its initial weights, drawn from run.seed)")
        title, evaluated = f"the policy of template {info['policy_from']}{model}", (
            "- checkpoint: none, the policy as the template builds it, before any training (reported as step 0)")
    else:
        title = info["run_dir"]
        evaluated = f"- checkpoints (training step): {', '.join(str(c['step']) for c in info['checkpoints'])}"
    text = [
        f"# Evaluation of {title}",
        "",
        evaluated,
        f"- tasks: {', '.join(t['name'] + ' (' + t['simulator'] + ', ' + status[t['name']] + ')' for t in info['tasks'])}",
        f"- protocols: {protocols} (greedy: the policy's mode; sampled@T: sampled at temperature T, "
        "for the Gaussian MLP policy the std scaled by T)",
        f"- episodes: {info['episodes_per_task']} per task, checkpoint and protocol, from initial states "
        f"{info['init_state_ids']['first']} .. {info['init_state_ids']['last']} (the same for every checkpoint and "
        f"protocol); seed {info['seed']}",
        "- success: the simulator's success test; 95% confidence intervals: Wilson score; mean length in "
        "decision steps",
    ]
    if line := hosts_line(info):
        text.append(line)
    if unfinished:
        text.append(f"- **not finished**: {', '.join(unfinished)} (the table holds the finished tasks; "
                    f"`{OVERALL}` pools them)")
    text += ["", markdown_table(rows), "", "![success vs checkpoint](success_vs_checkpoint.png)"]
    if skipped:
        text += ["", "## Skipped tasks (checked before any rollout)", "", "| task | simulator | reason |",
                 "|---|---|---|"]
        text += [f"| {s['task']} | {s['simulator']} | {s['reason']} |" for s in skipped]
    if videos:
        text += ["", "## Videos (stored actions replayed from the same initial state)", ""]
        text += [f"- [{v['file']}]({v['file']}): {v['task']}, {v['protocol']}, "
                 f"{'success' if v['stored_success'] else 'failure'}"
                 f"{'' if v['stored_success'] == v['replayed_success'] else ' (replay differs!)'}" for v in videos]
    _write(eval_dir / "report.md", "\n".join(text) + "\n")
    overall = [r for r in rows if r["task"] == OVERALL] or rows
    if overall:
        evaluated = [t["name"] for t in info["tasks"] if status[t["name"]] == COMPLETE]
        plot_success_vs_checkpoint(overall, eval_dir / "success_vs_checkpoint.png",
                                   f"success vs checkpoint ({', '.join(evaluated)})")
    return report


class ReportProgress:
    """The report of an evaluation in progress (see the module docstring), written by the driver.

    Args:
        eval_dir: the evaluation directory.
        protocol_info: as for :func:`write_report` (its ``tasks`` are the tasks that run).
        tasks: the tasks that run, in work order (:class:`~vla_rl.evaluation.benchmarks.EvalTask`).
        skipped: the tasks skipped before any rollout, ``{"task", "simulator", "reason"}`` each.
        steps, protocols, init_state_ids: the checkpoints' steps, the protocols and the initial
            states of every task (what is planned).
    """

    def __init__(self, eval_dir: Path, protocol_info: dict, tasks, skipped: list[dict], steps: list[int],
                 protocols, init_state_ids: np.ndarray) -> None:
        self.eval_dir, self.info, self.tasks, self.skipped = Path(eval_dir), protocol_info, list(tasks), skipped
        self.steps, self.protocols, self.init_state_ids = steps, protocols, init_state_ids
        self.planned = planned_keys(steps, protocols, init_state_ids)
        self.complete: list[str] = []
        self._reported: dict[str, str] | None = None  # the task states of the report on disk

    def update(self) -> bool:
        """Record the tasks finished since the last call (tasks finish in work order); when one
        did, write its ``results/<task>.json``; write the report when one did or another task's
        state changed since the last report (the first call takes the states it finds as the
        report's). Returns whether a task finished."""
        changed = False
        for task in self.tasks[len(self.complete):]:
            if task_status(self.eval_dir, task.name, self.planned) != COMPLETE:
                break
            self.complete.append(task.name)
            rows = summarize(self.eval_dir, [task], self.steps, self.protocols, self.init_state_ids)
            _write(self.eval_dir / RESULTS_DIR / f"{task.name}.json",
                   json.dumps({"task": task.name, "simulator": task.simulator, "env": task.env, "results": rows},
                              indent=2))
            changed = True
        status = self.status()
        if self._reported is None and not changed:
            self._reported = status
        if changed or status != self._reported:
            self.write(status)
        return changed

    def status(self) -> dict[str, str]:
        """Each task's state (:data:`COMPLETE`, ..., :data:`SKIPPED`), from the stores on disk."""
        status = {task.name: COMPLETE if task.name in self.complete
                  else task_status(self.eval_dir, task.name, self.planned) for task in self.tasks}
        status.update({s["task"]: SKIPPED for s in self.skipped})
        return status

    def write(self, status: dict[str, str] | None = None) -> dict:
        """Write the report of the finished tasks (every task's state, the skipped ones with their
        reason); returns it.

        Args:
            status: the tasks' states as :meth:`status` just found them (None: found now).
        """
        done = [task for task in self.tasks if task.name in self.complete]
        status = self.status() if status is None else status
        self._reported = status
        info = {**self.info, "tasks": self.info["tasks"] + [{"name": s["task"], "simulator": s["simulator"],
                                                             "env": s["env"]} for s in self.skipped]}
        rows = summarize(self.eval_dir, done, self.steps, self.protocols, self.init_state_ids) if done else []
        info.update(counted_hosts(self.eval_dir, done, self.steps, self.protocols, self.init_state_ids))
        return write_report(self.eval_dir, info, rows, [{k: s[k] for k in ("task", "simulator", "reason")}
                                                         for s in self.skipped], status)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(path, text)
