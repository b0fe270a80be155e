"""An evaluation's figures from its counts, without Ray: replicated shards' shares sum back to
whole counts, a batch whose every episode was lost is reported, not divided by, and the episodes
lost over an evaluation's passes are counted in its figures."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from vla_rl.dag.loader import load_template
from vla_rl.evaluation.session import EvaluationSession, _figures
from vla_rl.nodes.evaluation import load_eval_episodes, record_eval_episodes, rollout_eval_episodes
from vla_rl.utils.stats import wilson_interval
from vla_rl_core import keys


def test_counts_summed_from_replicas_shares_are_whole():
    """With eval_record at a DP size below the world size, each of 6 replicas adds 1/6 of a count:
    1 success of 50 summed to 0.9999999999999999 and was truncated to 0 (a 0% success rate)."""
    shares = np.zeros(3)
    for _ in range(6):
        shares += np.array([1.0, 50.0, 500.0]) / 6
    assert shares[0] < 1.0  # float64: the case that truncated
    figures = _figures("eval/greedy", shares)
    assert figures["eval/greedy/success_rate"] == 0.02 and figures["eval/greedy/episodes"] == 50.0
    assert (figures["eval/greedy/ci_low"], figures["eval/greedy/ci_high"]) == pytest.approx(wilson_interval(1, 50))


def test_a_batch_whose_every_episode_was_lost_reports_its_loss():
    """Its chunks ran (environment steps > 0), then the simulator failed: a later step redoes the
    episodes; the node divided the steps by zero episodes."""
    batch = TensorDict({"init_state_id": torch.arange(3)}, batch_size=[3])
    evaluation = SimpleNamespace(rollout=lambda b: (b[:0], 240), lost_here=0)
    output = rollout_eval_episodes(SimpleNamespace(resources=SimpleNamespace(evaluation=evaluation)), batch)
    assert len(output.batch) == 0 and output.metrics == {} and evaluation.lost_here == 3


class FlakySession(EvaluationSession):
    """Items 0..9; the first rollout of items 3 and 4 is lost (a remote robot's NaN), then redone."""

    def __init__(self):
        super().__init__(SimpleNamespace(config=load_template("embodied_srpo", ["eval.protocols=[greedy]"]).config),
                         ["lift"], [None], keys.INIT_STATE_ID)
        self.tried: set[int] = set()

    def shard_items(self, dp_rank, dp_size):
        return np.arange(10)[dp_rank::dp_size]

    def rollout(self, batch):
        items = batch[keys.INIT_STATE_ID].tolist()
        kept = [i not in (3, 4) or i in self.tried for i in items]
        self.tried.update(items)
        episodes = batch[torch.as_tensor(kept)]
        episodes[keys.SUCCESS] = episodes[keys.INIT_STATE_ID] % 2 == 0
        episodes[keys.FINISH_STEP] = torch.full((len(episodes),), 5)
        return episodes, 5 * len(items)


def test_episodes_lost_during_an_evaluation_are_in_its_figures(process_group):
    """eval/lost_fraction was the last pass's, which never lost one (else it would not be the last):
    0.0 after a pass that lost 2 of 10 episodes. Now the evaluation counts them."""
    session = FlakySession()
    ctx = SimpleNamespace(resources=SimpleNamespace(evaluation=session), tag="final", step=3, dp_rank=0, dp_size=1,
                          replicas=1, group=None, video=False)
    passes = []
    while True:
        batch = load_eval_episodes(ctx, None).batch[:4]  # passes of 4 items
        episodes = rollout_eval_episodes(ctx, batch).batch
        passes.append(record_eval_episodes(ctx, episodes).metrics)
        if passes[-1]["eval/remaining"].value == 0:
            break
    figures = {name: metric.value for name, metric in passes[-1].items()}
    assert len(passes) == 3 and figures["eval/greedy/episodes"] == 10 and figures["eval/greedy/success_rate"] == 0.5
    assert figures["eval/lost_episodes"] == 2 and figures["eval/lost_fraction"] == pytest.approx(2 / 12)


class DeadSimulatorSession(FlakySession):
    """Every rollout is lost (a simulator that never answers within simulator.step_timeout_s)."""

    def rollout(self, batch):
        return batch[:0], 0


def test_an_evaluation_whose_every_episode_is_lost_stops_after_a_few_steps(process_group):
    """It redid the lost episodes forever (130 passes over 2 episodes in 7 minutes, measured with
    simulator.step_timeout_s=0.001); training goes on without lost episodes, an evaluation cannot."""
    from vla_rl.errors import RunStopped
    from vla_rl.evaluation.session import MAX_FRUITLESS_STEPS

    session = DeadSimulatorSession()
    ctx = SimpleNamespace(resources=SimpleNamespace(evaluation=session), tag="final", step=3, dp_rank=0, dp_size=1,
                          replicas=1, group=None, video=False)
    for step in range(MAX_FRUITLESS_STEPS):
        episodes = rollout_eval_episodes(ctx, load_eval_episodes(ctx, None).batch[:4]).batch
        if step < MAX_FRUITLESS_STEPS - 1:
            assert record_eval_episodes(ctx, episodes).metrics["eval/remaining"].value == 10
            continue
        with pytest.raises(RunStopped, match=rf"^evaluation final: its last {MAX_FRUITLESS_STEPS} steps lost every "
                                             rf"episode to simulator faults \({4 * MAX_FRUITLESS_STEPS} lost in all\) "
                                             "and finished none"):
            record_eval_episodes(ctx, episodes)
    # a step that finishes an episode starts the count again (the flaky session above finishes)
    flaky = FlakySession()
    flaky.fruitless = MAX_FRUITLESS_STEPS - 1
    flaky.add_counts(np.array([[[[1.0, 1.0, 5.0]]]]), lost=2)
    assert flaky.fruitless == 0


class ItemsSession(FlakySession):
    """FlakySession's items and rollouts, for other tasks and targets."""

    def __init__(self, tasks: list[str], target_steps: list[int | None]):
        super().__init__()
        EvaluationSession.__init__(self, self.res, tasks, target_steps, keys.INIT_STATE_ID)


def test_the_mean_episode_length_is_over_the_episodes():
    figures = _figures("eval/greedy", np.array([1.0, 4.0, 20.0]))
    assert figures["eval/greedy/episode_length"] == 5.0 and figures["eval/greedy/success_rate"] == 0.25


def test_a_checkpoints_figures_are_under_its_step_and_the_live_policys_under_the_live_step():
    session = ItemsSession(["lift"], [7, None])
    session.begin("final", 3)
    assert (session.step_of(0), session.step_of(1)) == (7, 3)
    session.add_counts(np.array([[[[1.0, 2.0, 10.0]], [[2.0, 2.0, 8.0]]]]))
    figures = session.metrics()
    assert (figures["eval/step7/greedy/success_rate"], figures["eval/step3/greedy/success_rate"]) == (0.5, 1.0)


def test_one_tasks_figures_are_not_repeated_under_its_name():
    session = ItemsSession(["lift"], [None])
    session.begin("final", 3)
    session.add_counts(np.array([[[[1.0, 2.0, 10.0]]]]))
    assert sorted(session.metrics()) == ["eval/greedy/ci_high", "eval/greedy/ci_low", "eval/greedy/episode_length",
                                         "eval/greedy/episodes", "eval/greedy/success_rate", "eval/lost_episodes",
                                         "eval/lost_fraction"]


def test_a_new_evaluation_starts_its_counts_afresh():
    session = ItemsSession(["lift", "door"], [None])
    session.begin("step_10", 10)
    session.add_counts(np.array([[[[2.0, 2.0, 10.0]]], [[[0.0, 2.0, 12.0]]]]))
    session.begin("step_10", 10)  # the same evaluation: a no-op
    assert session.metrics()["eval/greedy/episodes"] == 4.0
    session.begin("step_20", 20)
    session.add_counts(np.array([[[[0.0, 1.0, 6.0]]], [[[0.0, 0.0, 0.0]]]]))
    figures = session.metrics()
    assert figures["eval/greedy/episodes"] == 1.0 and figures["eval/lift/greedy/success_rate"] == 0.0
    assert "eval/door/greedy/episodes" not in figures  # no episode of door in this evaluation
