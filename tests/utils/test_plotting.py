"""The success curve is drawn when there is a success rate, and not as an empty plot otherwise."""

from vla_rl.utils.plotting import plot_success_curve


def test_curve_written_from_training_and_evaluation_records(tmp_path):
    records = [
        {"step": 0, "eval/greedy/success_rate": 0.2, "eval/greedy/ci_low": 0.1, "eval/greedy/ci_high": 0.3},
        {"step": 1, "rollout/success_rate": 0.25},
        {"step": 2, "rollout/success_rate": 0.5},
    ]
    path = tmp_path / "success_rate.png"
    assert plot_success_curve(records, path, "run") is True
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "success_rate.tmp.png").exists()


def test_no_file_without_a_success_rate(tmp_path):
    path = tmp_path / "success_rate.png"
    assert plot_success_curve([{"step": 1, "sft/loss": 0.5}], path, "run") is False
    assert not path.exists()
