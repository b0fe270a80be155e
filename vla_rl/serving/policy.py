"""The policy behind ``vla-rl serve``: loaded from a training run, a checkpoint or an export, acting
on batches of client observations exactly as the rollouts act (greedy, or sampled on request).

What may be served (:func:`load_served_policy`):

- a checkpoint directory ``<run>/checkpoints/step_*`` or a run directory (its newest complete
  checkpoint): the run's policy rebuilt from its resolved template, weights verified and loaded
  (:func:`vla_rl.export.load_checkpoint_policy`), LoRA merged;
- an MLP export (``config.json`` + ``model.safetensors``, :meth:`MLPPolicy.from_pretrained`): it
  takes its flat state;
- any other export (π0, OpenVLA, OpenVLA-OFT, written by ``vla-rl export``) together with the
  template that describes how it was trained (``--template embodied_srpo_pi0_lift`` plus
  overrides): the template's policy section with ``policy.config.model_path`` set to the export.

The inputs the policy takes come from one environment of the run's simulator made in this
process (its observation space, image sizes and instruction), as ``vla-rl export`` reads its sizes.

Precision: a checkpoint or a template export is served as the run's rollouts computed on the
serving device (its ``trainer`` section, :func:`vla_rl.trainers.strategy.autocast` and
:func:`~vla_rl.trainers.strategy.policy_dtype`): on CUDA/NPU under ``trainer.mixed_precision:
auto`` (or ``bf16``) a DDP run's policy keeps its float32 weights and acts in
``torch.autocast(bfloat16)``, an FSDP run's acts with bfloat16 parameters; on the CPU it acts in
float32 (a ``bf16`` run served on a CPU included). An MLP export records no training settings and
acts in its own dtype.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vla_rl.serving import ServeError
from vla_rl.serving.inputs import ServedInputs
from vla_rl_core.observations import stack_observations, to_torch
from vla_rl_core.run_layout import CHECKPOINTS_DIR

logger = logging.getLogger(__name__)


class ServedPolicy:
    """A policy acting on batches of observations for the server.

    Args:
        policy: a :class:`policies.base.Policy`, on the device it acts on.
        inputs: the observation it takes.
        name: what the server calls it (metadata, logs).
        temperature: > 0, the sampled requests' temperature (1.0: the trained distribution).
        seed: seed of the sampled requests' random generator (on the policy's device).
        trainer: the ``trainer`` section of the run the policy comes from: the policy then computes
            as that run's rollouts did on this device (module docstring); None: in its own dtypes.
        action_bounds: ``(low, high)``, float32 ``(action_dim,)`` each: the action space of the
            simulator the policy trained on; served actions are clipped to it, as that simulator
            executed them (:func:`vla_rl_core.env_spec.executed_actions`). None: not known (an MLP
            export records no simulator), served as the policy gives them.

    Raises:
        ServeError: ``temperature`` is not > 0, or ``action_bounds`` do not have the policy's
            ``action_dim`` values.
    """

    def __init__(self, policy, inputs: ServedInputs, name: str, temperature: float = 1.0, seed: int = 0,
                 trainer=None, action_bounds: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        from vla_rl.trainers.strategy import cast_for_rollouts
        from vla_rl.utils.device import use_tf32

        if not temperature > 0:
            raise ServeError(f"--temperature must be > 0, got {temperature}")
        if action_bounds is not None:
            action_bounds = tuple(np.asarray(b, dtype=np.float32) for b in action_bounds)
            if any(b.shape != (int(policy.action_dim),) for b in action_bounds):
                raise ServeError(f"the action bounds have shapes {[b.shape for b in action_bounds]}; the policy's "
                                 f"actions have {policy.action_dim} values")
        self.action_bounds = action_bounds
        use_tf32(policy.device)  # the float32 products in TF32, as in the run's DAG workers
        self.policy = policy.eval()
        self.inputs = inputs
        self.name = name
        self.temperature = float(temperature)
        self.generator = torch.Generator(device=policy.device).manual_seed(seed)
        trainer = None if trainer is None else trainer.portable()  # a bf16 run on a CPU: float32, not refused
        self.trainer = trainer
        if trainer is not None:
            cast_for_rollouts(self.policy, trainer, policy.device)  # FSDP mixed precision: bfloat16

    def precision(self) -> contextlib.AbstractContextManager:
        """The context of the policy's forward passes: the run's rollouts' ``torch.autocast``
        (DDP's mixed precision on an accelerator), else nothing."""
        from vla_rl.trainers.strategy import autocast

        return contextlib.nullcontext() if self.trainer is None else autocast(self.trainer, self.policy.device)

    @property
    def can_sample(self) -> bool:
        """Whether the policy has an action distribution (OpenVLA-OFT's L1 head acts greedily only)."""
        return self.policy.has_action_distribution

    def metadata(self) -> dict[str, Any]:
        """What the server sends each client on connect (openpi's server metadata)."""
        return {
            "server": "vla-rl",
            "policy": self.name,
            "action_horizon": int(self.policy.chunk_size),
            "action_dim": int(self.policy.action_dim),
            "inputs": self.inputs.describe(),
            "can_sample": self.can_sample,
            "temperature": self.temperature,
            # the training simulator's action space, which served actions are clipped to (None: not known)
            "action_low": None if self.action_bounds is None else self.action_bounds[0].tolist(),
            "action_high": None if self.action_bounds is None else self.action_bounds[1].tolist(),
        }

    @torch.no_grad()
    def act(self, observations: Sequence[Any], sample: bool) -> np.ndarray:
        """Action chunks for a batch of observations, as the rollout computes them.

        Args:
            observations: ``n`` observations of :meth:`ServedInputs.engine_observation`.
            sample: sample at ``temperature`` instead of taking the mode.

        Returns:
            float32 ``(n, chunk_size, action_dim)``: the simulator's (robot's) actions,
            ``policy.env_actions`` of the chosen actions, clipped to ``action_bounds`` when known
            (a non-finite value stays non-finite: the server sends an error instead).

        Raises:
            ValueError: ``sample`` for a policy without an action distribution.
        """
        policy = self.policy
        obs = to_torch(stack_observations(list(observations))).to(policy.device)
        if sample and not self.can_sample:
            raise ValueError(f"the {self.name} policy has no action distribution: it acts greedily only")
        with self.precision():
            if not policy.has_action_distribution:
                actions = policy.predict_action_chunk(obs)
            elif sample:
                actions = policy.sample_actions(obs, greedy=False, generator=self.generator,
                                                temperature=self.temperature)[0]
            else:
                actions = policy.sample_actions(obs, greedy=True)[0]
        actions = policy.env_actions(actions, obs).float().cpu().numpy()
        if self.action_bounds is None:
            return actions
        # inf and NaN stay as they are (clipping would make inf a bound): the server sends an error instead
        return np.where(np.isfinite(actions), np.clip(actions, *self.action_bounds), actions)


def load_served_policy(target: str | Path, template: str | None = None, overrides: Sequence[str] = (),
                       device: str | None = None, temperature: float = 1.0, seed: int = 0) -> ServedPolicy:
    """The policy of ``target`` (module docstring) on ``device``, ready to serve.

    Args:
        target: a run directory, a checkpoint directory, or an export directory.
        template: the training template of a non-MLP export (refused otherwise: a run records its own).
        overrides: dotted overrides of ``template`` (the export's training settings).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...; None: the first CUDA device if there is
            one, else the CPU.
        temperature: the sampled requests' temperature.
        seed: the sampled requests' seed.

    Raises:
        ServeError: ``target`` is none of these, fails verification, a non-MLP export comes
            without ``template``, a run, checkpoint or MLP export comes with ``template`` or
            ``overrides``, or the device does not exist.
    """
    from vla_rl.checkpoints import files as ckpt
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE
    from vla_rl.export import ExportError, OtherWorkflow, PolicyNotBuilt, load_checkpoint_policy

    path = Path(target).resolve()
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise ServeError(f"{path} {what}: name a run directory, a checkpoint directory or an export")
    try:
        path = ckpt.run_checkpoint(path)
    except FileNotFoundError as err:
        raise ServeError(f"nothing to serve: {err}") from err
    if (template is not None or overrides) and not template_export(path):
        given = " ".join([*([f"--template {template}"] if template is not None else []), *overrides])
        raise ServeError(f"{given}: --template and its overrides give the training settings of a π0/OpenVLA export; "
                         f"{path.name} records its own settings (serve it without them)")
    if (path / TRAINER_STATE_FILE).is_file():
        try:
            policy, config = load_checkpoint_policy(path, workflow="embodied")
        except PolicyNotBuilt as err:  # serve takes no settings of a checkpoint: export it with the new place
            raise ServeError(f"the run's policy cannot be built: {err.reason} (moved? export it with its new place, "
                             f"vla-rl export {err.checkpoint} OUT {' or '.join(f'{k}=DIR' for k in err.settings)}, "
                             "and serve OUT)") from err
        except OtherWorkflow as err:
            raise ServeError(f"{err.checkpoint} is a checkpoint of a {err.workflow} run; vla-rl serve serves robot "
                             "policies") from None
        except ExportError as err:
            raise ServeError(str(err)) from err
        if callable(getattr(policy, "merge_lora", None)):
            policy.merge_lora()
        (inputs, bounds), name = simulator_io(config), f"{config.policy.name} ({path.parent.parent.name}/{path.name})"
        trainer = config.trainer
    elif _mlp_export(path):
        from policies.mlp.modeling_mlp import MLPPolicy

        with _load_errors(path, "MLP export"):
            policy = MLPPolicy.from_pretrained(path)
        tasks = policy.config.num_tasks or None
        inputs, name = ServedInputs(policy.config.obs_dim, num_tasks=tasks), f"mlp ({path.name})"
        trainer, bounds = None, None
        logger.warning("%s records no simulator: its actions are served unclipped (serve the run or its checkpoint "
                       "to clip them to the action space it trained in)", path)
    else:
        if not any(file.suffix in _EXPORT_SUFFIXES for file in path.iterdir()):
            raise ServeError(f"{path} holds no policy: not a run directory (no {CHECKPOINTS_DIR}/), a checkpoint "
                             f"(no {TRAINER_STATE_FILE}) nor an export (no config.json, *.safetensors or *.pt)")
        if template is None:
            raise ServeError(f"{path} is an export of a policy that needs its training settings: add --template "
                             "TEMPLATE (the template it was trained with, e.g. embodied_srpo_pi0_lift) and its overrides")
        with _load_errors(path, f"export of template {template}"):
            policy, config = _export_policy(path, template, overrides)
        (inputs, bounds), name = simulator_io(config), f"{config.policy.name} ({path.name})"
        trainer = config.trainer
    return ServedPolicy(policy.to(resolve_device(device)), inputs, name, temperature, seed, trainer=trainer,
                        action_bounds=bounds)


def simulator_io(config) -> tuple[ServedInputs, tuple[np.ndarray, np.ndarray] | None]:
    """The inputs of a policy trained on ``config``'s simulator and the bounds of its action space
    ``(low, high)``: one environment made (and closed) in this process, read as a simulator worker
    reads it (its spec), with its instruction. The bounds are None for an environment that runs
    its chunks elsewhere (a remote one: the robot's own environment clips to bounds it does not
    tell the trainer)."""
    from simulators.gym_vector import env_spec
    from simulators.registry import make_env
    from simulators.stepping import ChunkedSteps

    sim = config.simulator
    env = make_env(sim.name, sim.env_config())  # a task set's first task: its tasks share one layout
    try:
        spec = env_spec(env)
        instruction = None if sim.multi_task else env.instruction
        bounds = None if isinstance(env, ChunkedSteps) else (np.asarray(env.action_space.low, np.float32),
                                                             np.asarray(env.action_space.high, np.float32))
    finally:
        env.close()
    if sim.multi_task:
        spec = spec.with_tasks(len(sim.task_names()))
    if bounds is None:
        logger.warning("the %s simulator's environments clip actions on their own side: its actions are served "
                       "unclipped", sim.name)
    return ServedInputs.from_spec(spec, instruction), bounds


#: The files one of vla-rl export's layouts holds at least one of (the module docstring of vla_rl.export).
_EXPORT_SUFFIXES = (".json", ".safetensors", ".pt")


@contextlib.contextmanager
def _load_errors(path: Path, kind: str):
    """A policy directory that does not load (a missing or truncated weight file, a config of the
    wrong values or for other sizes, a missing tokenizer) as one :class:`ServeError` line."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, ValueError, RuntimeError, KeyError, SafetensorError) as err:
        if isinstance(err, ServeError):
            raise
        raise ServeError(f"{path} does not load as an {kind}: {type(err).__name__}: {err}".replace("\n", " ")) from None


def template_export(path: Path) -> bool:
    """Whether ``path`` is an export that needs its training template (not a checkpoint, not an MLP export)."""
    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE

    return not (path / TRAINER_STATE_FILE).is_file() and not _mlp_export(path)


def _mlp_export(path: Path) -> bool:
    from policies.mlp.modeling_mlp import MODEL_CONFIG_FILE

    try:
        return json.loads((path / MODEL_CONFIG_FILE).read_text()).get("policy") == "mlp"
    except (OSError, ValueError, AttributeError):
        return False


def _export_policy(path: Path, template: str, overrides: Sequence[str]):
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.registry import WORKFLOWS

    trained = load_template(template, overrides).config  # the template's own policy, before the export's settings
    if trained.run.workflow != "embodied":
        raise ServeError(f"template {template} trains a {trained.run.workflow} policy; vla-rl serve serves robot policies")
    if trained.policy.name == "mlp":  # an MLP export records its own settings (and is served without a template)
        raise ServeError(f"template {template} trains an MLP policy, and {path} is not an MLP export: name the "
                         "template its π0 or OpenVLA run was trained with")
    overrides = [*overrides, f"policy.config.model_path={path}", "policy.config.architecture=null", "policy.lora=null"]
    config = load_template(template, overrides).config
    return WORKFLOWS.get("embodied").standalone_policy(config, None), config


def resolve_device(device: str | None) -> torch.device:
    """``--device``: None picks cuda if present, else cpu.

    Raises:
        ServeError: not a device, or a CUDA device this machine does not have.
    """
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as err:
        raise ServeError(f"--device {device!r} is not a device ({err})") from None
    if resolved.type == "cuda" and not (torch.cuda.is_available() and (resolved.index or 0) < torch.cuda.device_count()):
        raise ServeError(f"--device {device}: no such CUDA device on this machine "
                         f"({torch.cuda.device_count()} visible)")
    return resolved
