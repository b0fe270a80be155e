"""metrics.jsonl: a record per step, read back in order; a resume keeps the records up to its
checkpoint, and a last line cut short by a killed process neither stops the resume nor stays."""

from __future__ import annotations

import json

import pytest

from vla_rl.utils.tracking import MetricsLogger, read_metrics


def test_a_resume_keeps_the_records_up_to_its_step_and_drops_a_torn_last_line(tmp_path, caplog):
    logger = MetricsLogger(tmp_path)
    for step in range(4):
        logger.log(step, {"loss": 0.5 * step})
    logger.close()
    path = tmp_path / "metrics.jsonl"
    path.write_text(path.read_text() + '{"step": 4, "lo')  # killed while writing step 4
    assert [r["step"] for r in read_metrics(path)] == [0, 1, 2, 3]
    assert "cut short" in caplog.text
    resumed = MetricsLogger(tmp_path, resume_step=2)  # used to raise JSONDecodeError
    resumed.log(3, {"loss": 9.0})
    resumed.close()
    assert [(r["step"], r["loss"]) for r in read_metrics(path)] == [(0, 0.0), (1, 0.5), (2, 1.0), (3, 9.0)]


def test_a_damaged_line_before_the_last_is_an_error_naming_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0}) + "\nnot json\n" + json.dumps({"step": 1}) + "\n")
    with pytest.raises(ValueError, match=r"metrics\.jsonl: line 2 is not a JSON record"):
        read_metrics(path)
