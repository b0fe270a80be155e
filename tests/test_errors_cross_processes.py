"""The project's exceptions with arguments of their own survive pickling, as Ray pickles a
worker's exception to the driver: one that does not arrives as Ray's UnserializableException,
its message and its fields lost (ComponentConfigError, FieldError and CheckpointCorruptError did)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from policies.checkpoint_files import FieldError
from vla_rl.checkpoints.layout import CheckpointCorruptError
from vla_rl.dag.errors import TemplateError
from vla_rl.preflight import PreflightError
from vla_rl.run_dir import RunDirError
from vla_rl.workers.group import WorkerDiedError
from vla_rl_core.components import ComponentConfigError


@pytest.mark.parametrize("error", [
    ComponentConfigError("simulator.env.obs_keys", "['x'] not an observation of Lift"),
    FieldError("tokenizer.json: missing", "tokenizer_path"),
    CheckpointCorruptError("2 files truncated", [Path("a.safetensors"), Path("b.safetensors")]),
    WorkerDiedError(1, "run_step", "pid 7, killed"),
    TemplateError("must be > 0", file="x.yaml", node="actor", field="trainer.total_steps"),
    PreflightError("truncated", field="policy.config.model_path"),
    RunDirError("in use by pid 7", file="outputs/run"),
], ids=lambda error: type(error).__name__)
def test_an_error_crosses_processes_with_its_message_and_fields(error):
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error) and str(again) == str(error) and vars(again) == vars(error)
