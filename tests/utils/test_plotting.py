"""The success curve is drawn when there is a success rate, and not as an empty plot otherwise."""

import pytest

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


def test_the_held_out_mean_keeps_the_final_evaluations_of_runs_that_end_at_other_steps():
    """Runs stopped by trainer.total_env_steps end at other steps (16 and 17 here): their final
    evaluations are matched as final, so the mean line ends at the headline figure (it stopped at
    the warm start's point)."""
    from vla_rl.utils.plotting import evaluation_points, held_out_mean

    def run(last: int, per_step: float, final: float) -> tuple[list[dict], dict]:
        records = [{"step": 0, "eval/greedy/success_rate": 0.2}]
        records += [{"step": s, "rollout/total_env_steps": s * per_step} for s in range(1, last + 1)]
        records += [{"step": 10, "eval/greedy/success_rate": 0.4}, {"step": last, "eval/greedy/success_rate": final}]
        x_of_step = {0: 0.0, **{r["step"]: r["rollout/total_env_steps"] for r in records if "rollout/total_env_steps" in r}}
        return records, x_of_step

    evals = [evaluation_points(*run(16, 5000.0, 0.5)), evaluation_points(*run(17, 4700.0, 0.7))]
    assert set(evals[0]) == {0, 10, "final"}
    mean = held_out_mean(evals)
    expected = [(0.0, 0.2), ((50000 + 47000) / 2, 0.4), ((80000 + 79900) / 2, 0.6)]
    assert [x for x, *_ in mean] == [x for x, _ in expected]
    assert [y for _, y, *_ in mean] == pytest.approx([0.2, 0.4, 0.6])
    assert held_out_mean(evals[:1]) == []
    # 95% Student t intervals over the two runs: mean ± t_{0.975, 1} * s / sqrt(2), clipped to [0, 1]
    t_975_1 = 12.706204736174707
    assert mean[0][2:] == (0.2, 0.2)  # both 0.2: no spread
    assert mean[-1][2:] == (0.0, 1.0)  # 0.5 and 0.7: 0.6 ± 1.27
    evals[1]["final"] = (evals[1]["final"][0], 0.52)  # 0.5 and 0.52: s / sqrt(2) = 0.01
    assert held_out_mean(evals)[-1][2:] == pytest.approx((0.51 - t_975_1 * 0.01, 0.51 + t_975_1 * 0.01))
