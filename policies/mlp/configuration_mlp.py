"""Configuration of the MLP Gaussian policy (no torch import: configs stay light)."""

from __future__ import annotations

from dataclasses import dataclass

from policies.config_checks import is_int

# Hidden-layer activations the MLP policy knows (mapped to torch modules in modeling_mlp.py).
ACTIVATIONS = ("tanh", "relu", "elu", "gelu", "silu")


@dataclass
class MLPPolicyConfig:
    """Settings of :class:`policies.mlp.modeling_mlp.MLPPolicy`.

    Attributes:
        obs_dim: number of features of the flat state observation.
        action_dim: number of action values per step (e.g. 7 for OSC_POSE + gripper).
        hidden_sizes: widths of the hidden layers of the mean network, input to output; a list
            (from YAML) is converted to a tuple.
        activation: hidden-layer activation, one of ``ACTIVATIONS``.
        init_std: initial standard deviation of the Gaussian, in action units (actions live in
            [-1, 1]); 0.2 left room for RL after behaviour cloning on robosuite Lift.
        learn_std: learn the state-independent log-std with the policy (else it stays fixed at
            ``init_std``).
        min_std: lower bound of the standard deviation (action units), so that learning cannot
            collapse exploration or make log-probs blow up.
        num_tasks: tasks of a task set; > 0: the policy reads each observation's task id
            (``obs["task_id"]``) and appends its one-hot to the normalised state (set from the
            run's ``simulator.tasks``; 0: one task, flat observations).
        model_path: a local directory written by ``MLPPolicy.save_pretrained`` (``vla-rl
            export`` of an MLP run): the policy starts from its weights, log-std and observation
            statistics. Its ``config.json`` must give the same ``obs_dim``, ``action_dim``,
            ``hidden_sizes``, ``activation``, ``num_tasks`` and ``learn_std`` (an error names the
            first that differs); ``init_std`` is then the checkpoint's log-std, not this field.
            None: a freshly initialised policy.
    """

    obs_dim: int
    action_dim: int
    hidden_sizes: tuple[int, ...] = (256, 256)
    activation: str = "tanh"
    init_std: float = 0.2
    learn_std: bool = True
    min_std: float = 0.01
    num_tasks: int = 0
    model_path: str | None = None

    def __post_init__(self) -> None:
        """Validate the fields.

        Raises:
            ValueError: a field has an invalid value; the message says how to fix it.
        """
        for field in ("obs_dim", "action_dim"):
            value = getattr(self, field)
            if not is_int(value) or value < 1:
                raise ValueError(f"MLPPolicyConfig.{field} must be a positive int, got {value!r}")
        if not is_int(self.num_tasks) or self.num_tasks < 0:
            raise ValueError(f"MLPPolicyConfig.num_tasks must be an int >= 0, got {self.num_tasks!r}")
        if isinstance(self.hidden_sizes, (list, tuple)):
            self.hidden_sizes = tuple(self.hidden_sizes)
        sizes = self.hidden_sizes
        if not isinstance(sizes, tuple) or not all(is_int(size) and size >= 1 for size in sizes):
            raise ValueError(
                "MLPPolicyConfig.hidden_sizes must be positive ints, e.g. (256, 256); "
                f"got {self.hidden_sizes!r}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"MLPPolicyConfig.activation {self.activation!r} is unknown; use one of "
                f"{', '.join(ACTIVATIONS)}"
            )
        if not isinstance(self.learn_std, bool):
            raise ValueError(f"MLPPolicyConfig.learn_std must be a bool, got {self.learn_std!r}")
        for field in ("init_std", "min_std"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"MLPPolicyConfig.{field} must be a number, got {value!r}")
        if self.model_path is not None and (not isinstance(self.model_path, str) or not self.model_path):
            raise ValueError(f"MLPPolicyConfig.model_path must be a local directory, got {self.model_path!r}")
        if not self.min_std > 0:
            raise ValueError(f"MLPPolicyConfig.min_std must be > 0, got {self.min_std!r}")
        if not self.init_std >= self.min_std:
            raise ValueError(
                f"MLPPolicyConfig.init_std ({self.init_std!r}) must be >= min_std "
                f"({self.min_std!r}); lower min_std or raise init_std"
            )
