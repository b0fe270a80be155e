"""``vla-rl plan``'s traffic estimates: the keys each data hop moves and their bytes per step,
against values computed by hand for a tiny text configuration."""

from __future__ import annotations

import pytest

import vla_rl.nodes  # noqa: F401  (the built-in node functions: the DAG tests' conftest skips loading them)
from vla_rl.cli import main
from vla_rl.dag.loader import load_template
from vla_rl.dag.planner import plan
from vla_rl.dag.registry import WORKFLOWS
from vla_rl.dag.traffic import NodeRows, estimate_traffic, format_bytes, node_layouts, node_rows
from vla_rl.data.key_sizes import StepShape, observation_leaves, sample_bytes
from vla_rl_core import keys

from .helpers import node

# 4 prompts x 2 responses, prompts of 24 tokens (the generated ones have up to 18), responses of
# 4 tokens (no supervised warm start, whose targets need 18), 2 workers.
TINY_TEXT = ["text.prompts_per_step=4", "data.group_size=2", "text.max_prompt_length=24",
             "text.max_response_length=4", "text.sft_steps=0", "nodes.advantage.dp_size=1"]

# Bytes per sample, by hand: input_ids and attention_mask 24 int64 each (192 + 192), uid 8,
# responses 4 int64 (32), response_mask 4 bool (4), old_log_probs (4, 1) float32 (16),
# finish_step 8, truncated 1 (bool), and from the reward node rewards 4 (float32) and success 1 (bool).
REWARD_ROW = 192 + 192 + 8 + 32 + 4 + 16 + 8 + 1 + 4 + 1  # 458
ADVANTAGE_ROW = REWARD_ROW + 3 * 16  # + token_level_rewards, advantages, returns: (4,) float32 each


def _tiny_text_hops(world: int = 2):
    template = load_template("llm_grpo", TINY_TEXT)
    shape = WORKFLOWS.get("text").step_shape(template.config)
    return shape, estimate_traffic(plan(template, world), shape)


def test_text_step_shape_and_key_sizes():
    shape, _ = _tiny_text_hops()
    assert shape == StepShape(groups=4, group_size=2, decisions=4, chunk=1, action_dim=1, own_action_dim=1, obs={},
                             prompt_len=24)
    assert shape.samples == 8
    assert sample_bytes("input_ids", shape) == 192 and sample_bytes("old_log_probs", shape) == 16
    assert sample_bytes("ref_log_probs", shape) == 16  # (T, chunk, action_dim) float32
    assert sample_bytes("not_a_declared_key", shape) is None


def test_hops_of_a_tiny_text_step_match_hand_computed_bytes():
    _, hops = _tiny_text_hops()
    assert [(h.src, h.dst, h.src_dp_size, h.dst_dp_size) for h in hops] == [
        ("reward", "advantage", 2, 1), ("advantage", "group_filter", 1, 2), ("group_filter", "actor_update", 2, 2)]
    gather, scatter, rebalance = hops

    # DP 2 -> 1 on 2 workers: each worker holds 4 of the 8 rows and receives the other worker's 4.
    assert gather.keys == ("attention_mask", "finish_step", "input_ids", "old_log_probs", "response_mask",
                           "responses", "rewards", "success", "truncated", "uid")
    assert gather.row_bytes == REWARD_ROW == 458
    assert gather.rows == 8 and not gather.rows_upper_bound
    assert gather.total_bytes == 8 * 458 and gather.bytes_per_worker == 4 * 458
    assert gather.max_received == gather.max_sent == 4 * 458
    # metadata: 16-byte headers from the other rank, then its 2 group sizes (int64)
    assert gather.meta_bytes_per_worker == 16 + 2 * 8

    # DP 1 -> 2: rank 0 (the only owner) sends the second shard's 4 rows to rank 1.
    assert scatter.row_bytes == ADVANTAGE_ROW == 506
    assert scatter.total_bytes == 4 * 506 and scatter.max_received == scatter.max_sent == 4 * 506
    assert scatter.meta_bytes_per_worker == 16 + 4 * 8  # the owner's 4 group sizes

    # rebalance for the update: nothing moves when the filter leaves equal shards; at most the
    # surplus of a worker's 4 rows, of which it keeps 2.
    assert rebalance.rebalance and rebalance.rows_upper_bound and rebalance.total_bytes == 0
    assert rebalance.rebalance_bound_per_worker == 2 * 506
    assert rebalance.meta_bytes_per_worker == 16  # single samples: counts only, no group sizes


def test_full_dp_template_moves_no_rows_and_metadata_is_small_at_any_world_size():
    for world in (2, 8, 1024):
        template = load_template("llm_grpo", [f"text.prompts_per_step={2 * world}"])  # 2 prompts per worker
        shape = WORKFLOWS.get("text").step_shape(template.config)
        hops = estimate_traffic(plan(template, world), shape)
        assert [(h.src, h.dst, h.rebalance) for h in hops] == [("group_filter", "actor_update", True)]
        assert hops[0].total_bytes == 0
        assert hops[0].meta_bytes_per_worker == 16 * (world - 1)  # grows with W, 16 bytes per worker


def test_embodied_shape_from_the_simulator_config():
    template = load_template("embodied_srpo")
    shape = WORKFLOWS.get("embodied").step_shape(template.config)
    assert (shape.decisions, shape.chunk, shape.action_dim) == (100, 1, 7)
    assert shape.obs == observation_leaves(15) == {"": ((15,), "float32")}
    assert sample_bytes("obs", shape) == 101 * 15 * 4
    camera = WORKFLOWS.get("embodied").step_shape(load_template("embodied_srpo_oft_lift").config)
    assert (camera.decisions, camera.chunk) == (10, 8)  # ceil(80 / 8)
    assert sample_bytes("obs", camera) == 11 * (15 * 4 + 128 * 128 * 3 + 256)  # state, agentview, instruction
    assert camera.own_action_dim == camera.action_dim == 7
    assert sample_bytes("actions", camera) == 10 * 8 * 7 * 4


def test_pi0_actions_are_its_denoising_chains():
    """π0's own actions, and so ``actions`` and ``ref_log_probs``, are (num_steps + 1) *
    max_action_dim values per chunk position: (3 + 1) * 7 with the tiny preset of the template."""
    shape = WORKFLOWS.get("embodied").step_shape(load_template("embodied_srpo_pi0_lift").config)
    assert (shape.decisions, shape.chunk, shape.action_dim, shape.own_action_dim) == (10, 8, 7, 28)
    assert sample_bytes("actions", shape) == sample_bytes("ref_log_probs", shape) == 10 * 8 * 28 * 4
    assert sample_bytes("old_log_probs", shape) == 10 * 8 * 4
    # Executing 2 of the 8 model actions: decisions every 2 steps, each slot packing 4 positions' chains.
    prefix = WORKFLOWS.get("embodied").step_shape(
        load_template("embodied_srpo_pi0_lift", ["policy.config.executed_actions=2"]).config)
    assert (prefix.decisions, prefix.chunk, prefix.own_action_dim) == (40, 2, 4 * 28)
    assert sample_bytes("old_log_probs", prefix) == 40 * 2 * 4


@pytest.mark.parametrize("count, text", [(201, "201 B"), (1023, "1023 B"), (1024, "1 KiB"), (1608, "1.57 KiB"),
                                         (3 * 2**20, "3 MiB"), (2**30, "1 GiB")])
def test_format_bytes(count, text):
    assert format_bytes(count) == text


def test_plan_prints_the_hops_keys_and_bytes(capsys):
    assert main(["plan", "llm_grpo", *TINY_TEXT, "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "data hops of a training step: 4 groups x 2 samples" in out
    assert "reward -> advantage moves (bytes per sample): attention_mask 192, input_ids 192, responses 32" in out
    assert "3.58 KiB" in out  # the gather's 8 rows of 458 bytes
    # 4 rows of 458 bytes in, and half of the scatter's 4 rows of 506 bytes
    assert "per worker per step: 2.78 KiB of rows (+ up to 1012 B rebalancing unequal shards)" in out


def test_plan_of_a_template_without_rollout_counts_rows_not_groups(capsys):
    """llm_sft's table read "32 groups x 8 samples" (the unread data.group_size) over hops of 32 rows."""
    assert main(["plan", "llm_sft", "--world-size", "2"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "data hops of a training step: 32 rows (no rollout), T = 24 decisions, 2 workers" in out
    assert "groups x" not in out


def _embodied_hops(world: int, *overrides: str):
    template = load_template("embodied_srpo", [f"workers.num_workers={world}", *overrides])
    shape = WORKFLOWS.get("embodied").step_shape(template.config)
    return {(h.src, h.dst): h for h in estimate_traffic(plan(template, world), shape)}


def test_hops_after_an_uneven_cut_are_estimated_on_the_shards_the_cut_makes():
    """6 groups cut into 4 shards hold 1, 2, 1 and 2 groups (split_groups: the boundary nearest each
    quarter, ties to the earlier one); the estimate took 2, 2, 1 and 1 and said 28 rows moved
    between reward (dp 4) and advantage (dp 2), 12 of them from one worker (a helper audit)."""
    hops = _embodied_hops(4, "data.init_states_per_step=6", "data.group_size=4", "nodes.tasks.dp_size=1",
                          "nodes.advantage.dp_size=2")
    hop = hops[("reward", "advantage")]
    # rows per reward shard: 4, 8, 4, 8 (ranks 0-3); advantage shards of 12 rows on ranks {0, 1} and {2, 3}:
    # shard 0 = rank 0's 4 + rank 1's 8, shard 1 = rank 2's 4 + rank 3's 8; each rank of a block receives
    # the block's rows it does not hold: rank 0 gets 8, rank 1 gets 4, rank 2 gets 8, rank 3 gets 4
    assert hop.rows == 24 and hop.rows_moved == 8 + 4 + 8 + 4
    assert hop.max_sent == 8 * hop.row_bytes and hop.max_received == 8 * hop.row_bytes
    # metadata: 16-byte headers from the 3 other ranks, then their group sizes padded to the largest shard's 2
    assert hop.meta_bytes_per_worker == 3 * 16 + 3 * 2 * 8


def test_the_rebalance_bound_holds_after_an_uneven_cut():
    """3 groups of 4 cut into 2 shards hold 4 and 8 rows: the filter emptying the first, the
    rebalance moves 4 of the 8 rows; the bound said 3 (rows / W * (1 - 1 / W))."""
    hops = _embodied_hops(2, "data.init_states_per_step=3", "data.group_size=4", "nodes.tasks.dp_size=1",
                          "nodes.advantage.dp_size=1")
    rebalance = hops[("group_filter", "actor_update")]
    assert rebalance.rebalance and rebalance.max_shard_rows == 8
    assert rebalance.rebalance_bound_per_worker == 4 * rebalance.row_bytes


def test_sizes_of_keys_whose_shape_parts_are_unknown_or_untested():
    """Declared keys the text and embodied tests leave out, and sizes only the simulator or policy knows."""
    shape = StepShape(groups=1, group_size=1, decisions=5, chunk=2, action_dim=None, own_action_dim=None, obs=None)
    assert sample_bytes("actions", shape) is None and sample_bytes("ref_log_probs", shape) is None
    assert sample_bytes("obs", shape) is None
    assert sample_bytes("old_log_probs", shape) == 5 * 2 * 4
    assert sample_bytes("values", shape) == sample_bytes("advantages", shape) == 5 * 4  # (T,) float32
    for key in (keys.CONTROL_STEPS, keys.CHECKPOINT_INDEX, keys.PROTOCOL_INDEX, keys.INIT_STATE_ID, keys.TASK_ID):
        assert sample_bytes(key, shape) == 8, key  # int64 scalars
    assert observation_leaves(None) is None and observation_leaves(None, ("agentview",), 128, 10) is None


def _dummy_plan(write_template, monkeypatch, nodes, world):
    """The train phase of dummy nodes, its data node writing ``uid`` (8 bytes) and a key of unknown size."""
    from vla_rl.dag.registry import NODE_FUNCTIONS, NodeOutput, register_node

    monkeypatch.setattr(NODE_FUNCTIONS, "_entries", dict(NODE_FUNCTIONS._entries))  # for this test only
    register_node("data", "data_load", name="test_writer", writes=(keys.UID, "plugin_score"))(
        lambda ctx, batch: NodeOutput(batch))
    nodes[0]["fn"] = "test_writer"
    return plan(load_template(write_template(nodes=nodes)), world)


def test_an_uneven_cut_and_its_rebalance_by_hand(write_template, monkeypatch):
    """5 groups of 2 from one data shard over 3 workers: the cut holds 2, 1 and 2 groups (boundaries
    nearest 5/3 and 10/3 groups); the update's rebalance of 4, 2 and 4 rows targets 4, 3, 3 (the
    extra row to the fullest shard, the lowest index) and moves one row, from shard 2 to shard 1."""
    nodes = [node("tasks", "data", "data_load", dp_size=1), node("rollout", "rollout", "env_interact", ["tasks"]),
             node("actor", "actor", "model_train", ["rollout"])]
    result = _dummy_plan(write_template, monkeypatch, nodes, 3)
    shape = StepShape(groups=5, group_size=2, decisions=1)
    layouts = node_layouts(result.phase("train"), shape)
    assert layouts == {"tasks": [[1] * 5], "rollout": [[2, 2], [2], [2, 2]], "actor": [[1] * 4, [1] * 3, [1] * 3]}
    cut, rebalance = estimate_traffic(result, shape)
    assert (cut.src, cut.dst, cut.rebalance, cut.rows) == ("tasks", "rollout", False, 5)
    assert cut.keys == ("plugin_score", "uid") and cut.unknown_keys == ("plugin_score",) and cut.row_bytes == 8
    # rank 0 owns the 5 rows, keeps 2 and sends 1 to rank 1 and 2 to rank 2
    assert (cut.rows_moved, cut.total_bytes, cut.max_sent, cut.max_received) == (3, 24, 24, 16)
    # 16-byte headers and the owner's 5 group sizes (8 bytes each) from the 2 other ranks
    assert cut.meta_bytes_per_worker == 2 * 16 + 2 * 5 * 8
    assert (rebalance.src, rebalance.dst, rebalance.rebalance, rebalance.rows) == ("rollout", "actor", True, 10)
    assert (rebalance.rows_moved, rebalance.total_bytes, rebalance.max_shard_rows) == (1, 8, 4)
    assert rebalance.rebalance_bound_per_worker == (4 - 4 // 3) * 8
    assert rebalance.meta_bytes_per_worker == 2 * 16  # single samples: headers only


def test_rows_between_replicated_shards_leave_from_each_block_s_first_rank(write_template, monkeypatch):
    """DP 2 -> 4 on 4 workers: the owners are ranks 0 and 2 (the first of each block of 2); each
    keeps its first group of 2 rows and sends its second to the next rank."""
    nodes = [node("tasks", "data", "data_load", dp_size=4),
             node("rollout", "rollout", "env_interact", ["tasks"], dp_size=2),
             node("reward", "reward", "compute", ["rollout"]), node("actor", "actor", "model_train", ["reward"])]
    result = _dummy_plan(write_template, monkeypatch, nodes, 4)
    hops = {(h.src, h.dst): h for h in estimate_traffic(result, StepShape(groups=4, group_size=2, decisions=1))}
    gather = hops[("tasks", "rollout")]  # each rank's one row goes to the other rank of its block
    assert (gather.rows_moved, gather.max_sent, gather.max_received) == (4, 8, 8)
    scatter = hops[("rollout", "reward")]
    assert (scatter.rows, scatter.rows_moved, scatter.max_sent, scatter.max_received) == (8, 4, 16, 16)


def test_a_node_of_several_deps_takes_its_largest_input_s_rows_and_layout(write_template):
    nodes = [node("tasks", "data", "data_load"), node("rollout", "rollout", "env_interact", ["tasks"]),
             node("reward", "reward", "compute", ["tasks", "rollout"]),
             node("actor", "actor", "model_train", ["reward"])]
    phase = plan(load_template(write_template(nodes=nodes)), 2).phase("train")
    shape = StepShape(groups=4, group_size=3, decisions=1)
    assert node_rows(phase, shape)["reward"] == NodeRows(4, 3)
    assert node_layouts(phase, shape)["reward"] == [[3, 3], [3, 3]]
