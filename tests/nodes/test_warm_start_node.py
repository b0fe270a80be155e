"""The warm-start nodes (vla_rl/nodes/warm_start.py): every worker ends the warm start with rank
0's weights, whatever its own fit gave."""

from __future__ import annotations

import os
import types

import torch
import torch.distributed as dist
from spawned import run_workers
from tensordict import TensorDict

from policies.mlp import MLPPolicy, MLPPolicyConfig
from vla_rl.config import RunConfig
from vla_rl.nodes.warm_start import clone_behaviour
from vla_rl.trainers.warm_start import behaviour_cloning
from vla_rl.workers.context import NodeContext
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec


class _NoInitialStates:
    """A simulator pool for ``warm_start.norm_init_states: 0`` (no reset is asked for)."""

    capacity = 1

    def spec(self) -> EnvSpec:
        return EnvSpec(obs_dim=2, action_dim=1, horizon=4)


def _fit(rank: int) -> tuple[MLPPolicy, TensorDict, RunConfig]:
    """A policy, demonstrations and settings whose fit differs by rank, as the same fit's rounding
    differs on GPUs (the initial weights, the observations and the learning rate)."""
    torch.manual_seed(rank)
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=2, action_dim=1, hidden_sizes=(4,)))
    policy.log_std.requires_grad_(False)  # frozen (as a LoRA run's base): loaded alike, never moved
    policy.log_std.data.fill_(float(rank))  # here unlike on each rank, to see that it is not moved
    obs = torch.arange(8.0).reshape(4, 2) + rank
    actions = torch.linspace(-0.5, 0.5, 4).reshape(4, 1, 1).expand(4, policy.chunk_size, 1).contiguous()
    config = RunConfig.model_validate({"warm_start": {"bc_steps": 3, "bc_lr": 1e-2 * (rank + 1), "norm_init_states": 0}})
    return policy, TensorDict({keys.OBS: obs, keys.ACTIONS: actions}, batch_size=[4]), config


def _clone(rank: int, world: int, store_path: str) -> tuple[dict, dict]:
    """This rank's weights after the node, and after its own fit alone."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    policy, batch, config = _fit(rank)
    resources = types.SimpleNamespace(policy=policy, simulator_pool=_NoInitialStates())
    clone_behaviour(NodeContext("behaviour_cloning", 0, rank, world, 0, 1, config, None, resources), batch)
    dist.destroy_process_group()
    alone, batch, config = _fit(rank)
    ws = config.warm_start
    behaviour_cloning(alone, batch[keys.OBS], batch[keys.ACTIONS], ws.bc_steps, ws.bc_lr, ws.bc_batch_size,
                      seed=config.run.seed, obs_std_floor=ws.obs_std_floor)
    return dict(policy.state_dict()), dict(alone.state_dict())


def test_every_worker_ends_behaviour_cloning_with_rank_zeros_weights(tmp_path):
    """Two workers whose own fits differ hold rank 0's trained weights and normalisation statistics
    after the node (the reference and the first evaluation are built from them before the actor's
    strategy broadcasts anything); a frozen parameter is not moved."""
    results = run_workers(_clone, 2, str(tmp_path / "store"), nprocs=2)
    (node_0, alone_0), (node_1, alone_1) = results[0], results[1]
    assert set(node_0) >= {"obs_mean", "obs_std", "log_std"}
    for name, tensor in node_0.items():
        assert torch.equal(tensor, alone_0[name]), name
        assert torch.equal(node_1[name], alone_1[name] if name == "log_std" else tensor), name
    assert any(not torch.equal(alone_1[name], tensor) for name, tensor in node_0.items())  # rank 1's own fit differs
