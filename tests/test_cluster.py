"""Joining an existing Ray cluster: a two-node cluster on 127.0.0.1 (``ray.cluster_utils.Cluster``,
each node its own raylet), the workers spread over both nodes (asserted from Ray's node ids),
their simulator actors on their own node, the process group across them; the metrics equal a
single-node run's at the same seed. In subprocesses: the cluster must be the only Ray of its
process. A cluster started with `ray start`, through the command line: tests/test_ray_start_cluster.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from child_env import child_env

from vla_rl.dag.loader import REPO_ROOT

pytestmark = pytest.mark.e2e

EMBODIED = ["trainer.total_steps=2", "trainer.ppo_mini_batch_size=3", "trainer.ppo_epochs=1", "data.init_states_per_step=2",
            "data.group_size=3", "simulator.env.horizon=40", "eval.num_episodes=0", "warm_start.num_demos=1",
            "warm_start.bc_steps=10", "policy.config.hidden_sizes=[16]"]
TEXT = ["trainer.total_steps=2", "trainer.ppo_mini_batch_size=8", "trainer.ppo_epochs=1", "text.prompts_per_step=4",
        "data.group_size=4", "text.max_response_length=24", "text.sft_steps=10", "text.num_generated_train=256",
        "text.num_generated_test=16", "text.tiny_hidden_size=32", "eval.num_episodes=0",
        "algorithm.filter_groups.zero_variance=false"]

SCRIPT = textwrap.dedent("""
    import json, sys
    from vla_rl.driver import train
    template, out, cluster, overrides = sys.argv[1], sys.argv[2], sys.argv[3] == "cluster", sys.argv[4:]
    if cluster:
        from ray.cluster_utils import Cluster
        nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "node_ip_address": "127.0.0.1",
                                                              "include_dashboard": False})
        nodes.add_node(num_cpus=3, node_ip_address="127.0.0.1")
        overrides += [f"workers.ray_address={nodes.address}", "workers.placement_strategy=STRICT_SPREAD"]
    summary = train(template, [*overrides, f"run.output_dir={out}", "run.name=run"])
    print("SUMMARY " + json.dumps({"worker_nodes": summary["worker_nodes"]}))
""")


def run(template: str, overrides: list[str], out, cluster: bool) -> tuple[dict, list[dict]]:
    """Train in a subprocess whose ``HOME`` holds a Ray token (``~/.ray/auth_token``, as any local
    run leaves one) while the cluster has no authentication: the driver must not turn token mode on."""
    home = out.parent / "home"
    (home / ".ray").mkdir(parents=True, exist_ok=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    env = child_env(REPO_ROOT, HOME=str(home))
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", SCRIPT, template, str(out), "cluster" if cluster else "local",
                           *overrides], cwd=out.parent, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SUMMARY "))[8:])
    records = [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]
    return summary, [{k: v for k, v in r.items() if not k.startswith("timing/") and "_per_s" not in k
                      and "sim_" not in k} for r in records]


@pytest.mark.parametrize(("template", "overrides"), [("embodied_srpo", EMBODIED), ("llm_grpo", TEXT)])
def test_workers_spread_over_two_nodes_train_as_on_one(template, overrides, tmp_path):
    cluster_summary, on_cluster = run(template, overrides, tmp_path / "cluster", cluster=True)
    local_summary, on_one = run(template, overrides, tmp_path / "local", cluster=False)
    assert len(set(cluster_summary["worker_nodes"])) == 2  # one worker per node
    assert len(set(local_summary["worker_nodes"])) == 1
    assert on_cluster == on_one
    assert any("actor/pg_loss" in record or "rollout/success_rate" in record for record in on_cluster)
