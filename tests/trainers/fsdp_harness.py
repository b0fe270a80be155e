"""The harness of the two-worker FSDP/DDP tests (tests/trainers/test_fsdp.py,
test_fsdp_mixed_precision.py, test_critic_fsdp.py): each test module runs all its scenarios in
one spawn of two gloo workers (spawned processes, loopback; starting them costs more than the
scenarios) and its tests compare the records; and the helpers the scenarios share: a trainer
section, a recorded run of updates, whole gradients and weights, the MLP's and the causal LM's
shards, a ``monkeypatch`` for the workers, and the comparisons."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
import torch.distributed as dist
from spawned import run_workers
from tensordict import TensorDict

from vla_rl.utils.ray_utils import free_loopback_port

WORLD = 2
MLP_SPLIT = (5, 3)  # episodes of the 8 MLP episodes on each worker


def _entry(rank: int, port: int, scenarios: Callable, lm_dir: str, ckpt_root: str) -> dict:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # pyproject's filterwarnings do not reach spawned workers: a sharded module that returns a
    # view (an in-place op on it would skip its pre-backward all-gather) fails here as in-process
    warnings.filterwarnings("error", message="FSDP2-wrapped module .* returned a view tensor", category=UserWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        return scenarios(rank, lm_dir, ckpt_root)
    finally:
        dist.destroy_process_group()


def spawn_workers(scenarios: Callable[[int, str, str], dict], lm_dir, ckpt_root) -> dict[int, dict]:
    """Run ``scenarios(rank, lm_dir, ckpt_root)`` (a module-level function: it is pickled) on
    ``WORLD`` gloo workers; its records by worker: ``{rank: records}``."""
    return run_workers(_entry, free_loopback_port(), scenarios, str(lm_dir), str(ckpt_root), nprocs=WORLD)


def _trainer_section(**fields):
    from vla_rl.config import TrainerSection

    fsdp = fields.pop("fsdp", {})
    return TrainerSection(**{"ppo_epochs": 1, "ppo_mini_batch_size": 4, "max_grad_norm": 1.0, **fields}, fsdp=fsdp)


def _run(make_policy_fn, batch, algorithm, forward, steps: int = 2, lr: float = 1e-2, group=None, **trainer_fields):
    """Train a fresh policy for ``steps`` updates (over ``group``, default: both workers); its
    per-update losses and grad norms, the first minibatch's whole gradient, and the policy's final
    weights."""
    from vla_rl.trainers.actor import ActorTrainer

    policy = make_policy_fn()
    section = _trainer_section(**trainer_fields)
    trainer = ActorTrainer(policy, lr=lr, group=group, forward=forward, trainer=section)
    first_grads: dict[str, torch.Tensor] = {}

    def record(optimizer, args, kwargs):
        if not first_grads:
            first_grads.update(_full_grads(trainer.parallel.trained))

    handle = trainer.optimizer.register_step_pre_hook(record)
    losses, norms = [], []
    for step in range(steps):
        metrics = trainer.update(batch, algorithm, section, torch.Generator().manual_seed(10 + step))
        losses.append(metrics["actor/pg_loss"])
        norms.append(metrics["actor/grad_norm"])
        if step == 0:
            handle.remove()
    return {"losses": losses, "norms": norms, "grads": first_grads, "weights": _weights(policy),
            "trainable": sorted(n for n, p in policy.named_parameters() if p.requires_grad),
            "checkpointed_blocks": trainer.parallel.checkpointed_blocks}


def _full_grads(module) -> dict[str, torch.Tensor]:
    from torch.distributed.tensor import DTensor

    grads = {}
    for name, parameter in module.named_parameters():
        if parameter.grad is not None:
            grad = parameter.grad.full_tensor() if isinstance(parameter.grad, DTensor) else parameter.grad
            grads[name.replace("_checkpoint_wrapped_module.", "")] = grad.detach().clone()
    return grads


def _weights(module) -> dict[str, torch.Tensor]:
    return {name: tensor.detach().clone() for name, tensor in module.state_dict().items()}


def _mlp_setup(rank: int):
    from test_actor import TINY_CONFIGS, rollout_batch, update_config

    from policies import make_policy

    def fresh():
        torch.manual_seed(0)
        return make_policy("mlp", TINY_CONFIGS["mlp"]())

    batch = rollout_batch(fresh())
    start = sum(MLP_SPLIT[:rank])
    return fresh, batch[start:start + MLP_SPLIT[rank]], update_config


def _text_batch(policy, rank: int, repeats: int = 2) -> TensorDict:
    """Four responses per worker to ``4 / repeats`` prompts (``repeats`` sampled responses
    each), with fixed advantages; on the CPU, as the text rollout node hands its samples on
    (vla_rl/nodes/text.py), whatever the policy's device."""
    from vla_rl_core import keys

    count = 4 // repeats
    prompts = [[{"role": "user", "content": f"What is {i} + {2 * i + 1}?"}]
               for i in range(count * rank, count * rank + count)]
    ids, mask = policy.processor.encode_prompts(prompts, max_length=32)
    ids, mask = ids.repeat_interleave(repeats, 0), mask.repeat_interleave(repeats, 0)
    generation = policy.generate(ids, mask, max_new_tokens=8, generator=torch.Generator().manual_seed(rank))
    response_mask = generation.response_mask.cpu()
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])[:, None] * response_mask
    return TensorDict({keys.INPUT_IDS: ids, keys.ATTENTION_MASK: mask, keys.RESPONSES: generation.responses.cpu(),
                       keys.RESPONSE_MASK: response_mask, keys.OLD_LOG_PROBS: generation.log_probs.cpu()[..., None],
                       keys.ADVANTAGES: advantages}, batch_size=[4])


class _Patch:
    """``monkeypatch.setattr`` for the spawned workers, undone by :meth:`undo`."""

    def __init__(self) -> None:
        self.saved: list = []

    def setattr(self, target, name, value) -> None:
        self.saved.append((target, name, getattr(target, name)))
        setattr(target, name, value)

    def undo(self) -> None:
        for target, name, value in reversed(self.saved):
            setattr(target, name, value)
        self.saved.clear()


def _max_abs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The largest absolute difference between same-named tensors (NaN where both are NaN: 0,
    e.g. OFT's unset proprio statistics)."""
    assert sorted(a) == sorted(b)
    gaps = [torch.where(a[k].isnan() & b[k].isnan(), 0.0, a[k].double() - b[k].double()).abs().max() for k in a]
    return max(float(gap) for gap in gaps)


def _max_loss_gap(a: dict, b: dict) -> float:
    return max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True))

