"""Which overrides ``vla-rl eval`` takes (:func:`vla_rl.eval_driver.prepare_eval_dir`): none of
settings no evaluation node reads (:func:`unread_by_evaluation`), and, for a run's checkpoints,
none that changes the tasks they were trained on (:func:`check_trained_tasks_kept`)."""

from __future__ import annotations

import yaml

from vla_rl.evaluation.targets import EvalInputError

UNREAD_SECTIONS = {"warm_start": "warm start", "algorithm": "training algorithm", "critic": "critic"}
"""Sections no evaluation node reads: an override of them would be written into the evaluation's
template and do nothing."""
READ_TRAINER_SETTINGS = ("strategy", "mixed_precision", "fsdp")
"""The ``trainer`` settings an evaluation reads (how the checkpoints' policy is placed and in
which precision it acts); the others are training's."""


def unread_by_evaluation(override: str) -> str | None:
    """What ``override`` (``KEY=VALUE``, or ``~KEY``) sets that no evaluation node reads (its
    section of :data:`UNREAD_SECTIONS`; a ``trainer`` setting but those of
    :data:`READ_TRAINER_SETTINGS`, the whole ``trainer`` section included), or None."""
    path = override.removeprefix("~").split("=", 1)[0].split(".")
    if path[0] in UNREAD_SECTIONS:
        return UNREAD_SECTIONS[path[0]]
    if path[0] == "trainer" and (len(path) == 1 or path[1] not in READ_TRAINER_SETTINGS):
        return "training (it reads trainer." + ", trainer.".join(READ_TRAINER_SETTINGS) + " only)"
    return None


TRAINED_TASK_SETTINGS = ("simulator", "simulator.name", "simulator.tasks")
"""The settings of a run's tasks that an evaluation of its checkpoints keeps (:func:`check_trained_tasks_kept`)."""


def check_trained_tasks_kept(override: str, trained) -> None:
    """Refuse an override (``KEY=VALUE`` or ``~KEY``) of :data:`TRAINED_TASK_SETTINGS` that changes
    what the checkpoints' policy was trained on (``trained``: the run's ``simulator`` section): a
    task set's policy reads a one-hot of the task's place in the set, which a reordered or other
    set gave another task, silently (a set of another size failed on a setting the user never
    gave, or with a traceback once Ray had started). ``eval.benchmark`` and ``eval.tasks``
    evaluate other tasks.

    Raises:
        EvalInputError: naming the setting and the run's value.
    """
    key, _, value = override.partition("=")
    deleted, key = key.startswith("~"), key.removeprefix("~").strip()
    if key not in TRAINED_TASK_SETTINGS:
        return
    field = key.removeprefix("simulator.") if key != "simulator" else None
    if field is not None and not deleted:
        try:
            if yaml.safe_load(value) == getattr(trained, field):  # the run's own value, given again
                return
        except yaml.YAMLError:
            pass  # refused below
    trained_on = f"the task set {trained.task_names()} in this order (its task one-hot)" if trained.multi_task else \
        f"{trained.name} {trained.task_names()[0]!r}"
    raise EvalInputError(f"{key}: vla-rl eval of a run evaluates the tasks its checkpoints were trained on, "
                         f"{trained_on}; evaluate other tasks with eval.benchmark (and eval.tasks)")
