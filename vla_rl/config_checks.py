"""Checks that every registered name a run config refers to exists, before anything starts."""

from __future__ import annotations

from pathlib import Path

from vla_rl.config import RunConfig
from vla_rl.dag.errors import TemplateError


def check_component_names(config: RunConfig, file: Path | None = None) -> None:
    """Resolve each component name of ``config`` in its registry.

    Raises:
        TemplateError: naming the config field (e.g. ``algorithm.reward``) and listing the known
            names, for the first unknown one.
    """
    from policies import POLICIES, available_policies
    from simulators import SIMULATORS
    from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from vla_rl.algorithms.aggregation import LOSS_AGG_MODES
    from vla_rl.algorithms.kl import KL_ESTIMATORS
    from vla_rl.algorithms.policy_loss import POLICY_LOSSES
    from vla_rl.algorithms.rewards import EMBODIED_REWARDS
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    available_policies()
    algo = config.algorithm
    embodied = [
        ("simulator.name", SIMULATORS, config.simulator.name),
        ("policy.name", POLICIES, config.policy.name),
        ("algorithm.reward", EMBODIED_REWARDS, algo.reward),
        ("algorithm.trajectory_encoder", TRAJECTORY_ENCODERS, algo.trajectory_encoder),
    ]
    checks = (embodied if config.run.workflow == "embodied" else []) + [
        ("algorithm.adv_estimator", ADVANTAGE_ESTIMATORS, algo.adv_estimator),
        ("algorithm.policy_loss", POLICY_LOSSES, algo.policy_loss),
        ("algorithm.loss_agg_mode", LOSS_AGG_MODES, algo.loss_agg_mode),
        ("algorithm.kl_loss_type", KL_ESTIMATORS, algo.kl_loss_type),
        ("algorithm.kl_penalty", KL_ESTIMATORS, algo.kl_penalty),
        ("critic.loss_agg_mode", LOSS_AGG_MODES, config.critic.loss_agg_mode),
    ]
    for field, registry, name in checks:
        if name not in registry:
            known = ", ".join(str(n) for n in registry.names())
            raise TemplateError(f"unknown {registry.kind} {name!r}; known: {known}", file=file, field=field)


def check_required_nodes(config: RunConfig, roles: set[str], file: Path | None = None) -> None:
    """Check that the template has the nodes its algorithm settings read from.

    Args:
        config: the run config.
        roles: the roles of the template's nodes.
        file: the template file, for the error message.

    Raises:
        TemplateError: naming the setting, when the KL terms lack a ``reference`` node or GAE
            lacks ``critic`` nodes.
    """
    algo = config.algorithm
    needs = [
        ("algorithm.use_kl_loss", algo.use_kl_loss, "reference", "(reference, model_inference) node"),
        ("algorithm.use_kl_in_reward", algo.use_kl_in_reward, "reference", "(reference, model_inference) node"),
        ("algorithm.adv_estimator", algo.adv_estimator == "gae", "critic",
         "(critic, model_inference) node before the advantage node and a (critic, model_train) node"),
    ]
    for field, used, role, what in needs:
        if used and role not in roles:
            raise TemplateError(f"this setting needs a {what}; see dag_templates/embodied_ppo.yaml and "
                                "docs/algorithms.md", file=file, field=field)


def check_rollout_backend(config: RunConfig, nodes, file: Path | None = None) -> None:
    """With ``text.rollout_backend: vllm``, check that every rollout node runs on all workers.

    Each worker's vLLM engine joins torch.distributed's existing default group (the workers'
    group) when it starts, which is collective: an engine started on only some workers waits
    for the others forever.

    Args:
        config: the run config.
        nodes: the template's :class:`~vla_rl.dag.schema.NodeSpec` list.
        file: the template file, for the error message.

    Raises:
        TemplateError: naming the node and its ``dp_size``.
    """
    if config.text.rollout_backend != "vllm":
        return
    world = config.workers.num_workers
    for node in nodes:
        if node.role == "rollout" and node.dp_size not in (None, world):
            raise TemplateError(f"text.rollout_backend=vllm needs the rollout node on every worker: dp_size "
                                f"{node.dp_size} != workers.num_workers ({world}); remove its dp_size",
                                file=file, node=node.id, field="dp_size")
