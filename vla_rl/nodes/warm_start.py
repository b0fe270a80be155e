"""The nodes of the ``warm_start`` phase, which runs once before training
(``dag_templates/phases/*_warm_start.yaml``): behaviour cloning from scripted demonstrations
for robot policies, supervised fine-tuning on the training prompts' answers for language models.

Both run at DP size 1: every worker reads all of the (few) demonstrations or examples and runs
the same fit from the run's seed, then takes rank 0's weights (one broadcast): the fits agree
bit for bit only where the kernels are deterministic (the CPU's, not a GPU's), and the workers
start RL from identical weights either way.

- ``(data, data_load, demonstrations)``: with ``warm_start.dataset``, the first
  ``warm_start.num_demos`` episodes of that LeRobot dataset (:mod:`vla_rl.data.lerobot_demonstrations`,
  checked when the template is planned); otherwise rank 0 makes sure the store holds
  ``warm_start.num_demos`` successful demonstrations of the simulator's scripted expert (of every
  task of a task set; zarr, reused by later runs), then every worker reads their transitions. A
  task without a scripted expert, a ``simulator.env.horizon`` shorter than its expert's measured
  demonstrations, or a robot it made none with is refused when the template is planned
  (:func:`simulators.experts.horizon_problem`); an expert that still makes too few names the
  horizon and what the expert needs;
- ``(actor, model_train, behaviour_cloning)``: the policy's observation normalisation and
  ``warm_start.bc_steps`` of behaviour cloning on them;
- ``(data, data_load, sft_examples)``: every row of the training prompts with its target answer
  (``text.sft_response_column``), encoded;
- ``(actor, model_train, supervised_fine_tune)``: ``text.sft_steps`` of supervised fine-tuning.

With ``warm_start.num_demos: 0`` (or ``text.sft_steps: 0``) they do nothing.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from simulators.registry import canonical_env
from vla_rl.dag.registry import NodeOutput, register_node
from vla_rl.errors import RunStopped
from vla_rl.nodes.text import SFT_KEYS
from vla_rl.utils.collectives import cpu_barrier
from vla_rl.utils.console import worker_bars
from vla_rl_core import keys
from vla_rl_core.run_layout import demo_store_path

DEMO_KEYS = (keys.OBS, keys.ACTIONS)


def demo_env_attrs(sim) -> dict:
    """What a demonstration store records of the simulator: its name, every setting of its
    validated config, defaults included (:func:`simulators.registry.canonical_env`; a task set's
    without ``task``), and a task set's tasks."""
    env = canonical_env(sim.name, sim.env)
    if sim.multi_task:
        env.pop("task", None)
        return {"name": sim.name, **env, "tasks": sim.task_names()}
    return {"name": sim.name, **env}


def task_configs(sim) -> list:
    """The typed simulator config of each task of the ``simulator`` section (one without a task set)."""
    from simulators.registry import SIMULATORS
    from vla_rl_core.components import build_config

    config_class = SIMULATORS.get(sim.name).config_class
    return [build_config(config_class, env, "simulator.env") for env in sim.task_envs()]


def check_experts(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    """The planner's check: with ``warm_start.num_demos > 0`` every task (of a task set) needs a
    scripted expert (else ``("warm_start.num_demos", <which task has none, which tasks have one>)``)
    that can act on the environment's observation (else the expert's own ``(field, why)``:
    :func:`simulators.experts.config_problem`, e.g. MetaWorld's with a hidden goal) and makes
    demonstrations within ``simulator.env.horizon`` with the robot, as far as its
    measurements tell (else ``("simulator.env.horizon" or "simulator.env.robot", <what it needs>)``:
    :func:`simulators.experts.horizon_problem`)."""
    from simulators.experts import (
        NoExpertError,
        config_problem,
        expert_class,
        horizon_problem,
        measured_steps,
    )

    sim, ws = config.simulator, config.warm_start
    if ws.num_demos == 0:
        return None if ws.dataset is None else (
            "warm_start.num_demos", f"0 clones no episode of warm_start.dataset ({ws.dataset}); give the number of "
            "its episodes to clone, or drop warm_start.dataset")
    if ws.dataset is not None:
        from vla_rl.data.lerobot_demonstrations import ACTIONS_ROLE, check_dataset

        if sim.multi_task:
            return "warm_start.dataset", "cloning a dataset is not supported with a task set (simulator.tasks) yet"
        env = sim.env_config()  # the sizes its config declares (unknown ones: None)
        sizes = {keys.OBS_STATE: getattr(env, "state_dim", None), ACTIONS_ROLE: getattr(env, "action_dim", None)}
        images = [f"{camera}{keys.OBS_IMAGE_SUFFIX}" for camera in getattr(env, "cameras", None) or ()]
        problem = check_dataset(ws.dataset, ws.dataset_keys, ws.num_demos, sizes, images)
        return None if problem is None else ("warm_start.dataset", problem)
    configs = task_configs(sim)
    for task_config in configs:
        try:
            expert_class(sim.name, task_config.task_name)
        except NoExpertError as err:
            return "warm_start.num_demos", str(err)
        if (problem := config_problem(sim.name, task_config)) is not None:
            return problem
    for task_config in configs:
        problem = horizon_problem(sim.name, task_config)
        if problem is not None and problem[0] == "simulator.env.horizon" and sim.multi_task:
            most, task = max((steps.most, c.task_name) for c in configs
                             if (steps := measured_steps(sim.name, c)) is not None)
            problem = (problem[0], f"{problem[1]} (all tasks of simulator.tasks: up to {most} control steps, "
                                   f"{task})")
        if problem is not None:
            return problem
    return None


def too_few_demonstrations(error: RuntimeError, sim) -> RunStopped:
    """The error of an expert that made too few demonstrations, naming ``simulator.env.horizon``
    and what each task's expert took where it was measured."""
    from simulators.experts import measured_steps

    configs = task_configs(sim)
    measured = []
    for task_config in configs:
        steps = measured_steps(sim.name, task_config)
        if steps is not None:
            measured.append(f"{task_config.task_name}: {steps.describe()}")
    needs = (f"; measured, with a long horizon: {'; '.join(measured)}" if measured
             else "; how long its episodes take was not measured (python -m simulators.experts.measure)")
    return RunStopped(f"{error}: each expert episode ends after simulator.env.horizon={configs[0].horizon} control "
                      f"steps{needs}. Raise simulator.env.horizon, or set warm_start.num_demos=0")


def _float32_weights_problem(config, what: str, skip: str) -> tuple[str, str] | None:
    """``(field, why)`` when ``what`` (a warm start, Adam outside the actor's strategy) would train
    parameters loaded in another dtype than float32 (``text.dtype``, ``policy.config.dtype``:
    :meth:`~vla_rl.config.RunConfig.low_precision_trained`); the planner's form of
    :func:`~vla_rl.trainers.strategy.refuse_low_precision_adam`, so that the run is refused before
    any worker loads a model."""
    if (trained := config.low_precision_trained()) is None:
        return None
    field, dtype = trained
    lora = f", {way}," if (way := config.lora_way_out()) else ""
    return field, (f"{what} would run Adam on the policy's {dtype} parameters (no float32 master weights: float16 "
                   f"gives NaN weights, bfloat16 drops small updates): use {field}=float32 "
                   f"(trainer.mixed_precision auto still computes the RL updates in bfloat16 on accelerators){lora} "
                   f"or {skip}")


def _clones_float32_weights(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    if config.warm_start.num_demos == 0:
        return None
    return _float32_weights_problem(config, "behaviour cloning (warm_start.num_demos > 0)", "warm_start.num_demos=0")


def _fine_tunes_float32_weights(config, node_config, dp_size: int, world_size: int) -> tuple[str, str] | None:
    if config.text.sft_steps == 0:
        return None
    return _float32_weights_problem(config, "supervised fine-tuning (text.sft_steps > 0)", "text.sft_steps=0")


@register_node("data", "data_load", name="demonstrations", writes=DEMO_KEYS, resources=("policy", "simulator_pool"),
               check=check_experts, phases=("warm_start",))
def load_demonstrations(ctx, batch) -> NodeOutput:
    """Returns the demonstrations' transitions: ``obs`` ``(N, obs_dim)`` (camera observations, or a
    task set's: a TensorDict of batch size ``(N,)``) and ``actions`` ``(N, chunk, action_dim)``, the
    expert's next actions for the chunk the policy clones (``policy.bc_chunk_size``: π0's whole
    model chunk even when it executes a prefix), in the simulator's units (not a policy's own
    actions, which may be wider, e.g. π0's denoising chains: behaviour cloning maps them with
    ``policy.actions_from_env``); empty without demonstrations."""
    from vla_rl.data.trajectory_store import TrajectoryStore
    from vla_rl.trainers.warm_start import demonstrations, ensure_demonstrations

    ws, sim = ctx.config.warm_start, ctx.config.simulator
    if ws.num_demos == 0:
        return NodeOutput(TensorDict({}, batch_size=[0]), {})
    if ws.dataset is not None:
        from vla_rl.data.lerobot_demonstrations import dataset_episodes
        from vla_rl.trainers.warm_start import episode_transitions

        try:
            episodes = dataset_episodes(ws.dataset, ws.dataset_keys, ws.num_demos, ctx.resources.simulator_pool.spec())
        except ValueError as err:
            raise RunStopped(str(err)) from None
        obs, actions = episode_transitions(episodes, ctx.resources.policy.bc_chunk_size)
        return NodeOutput(TensorDict({keys.OBS: obs, keys.ACTIONS: actions}, batch_size=[len(actions)]), {})
    store_path = demo_store_path(ctx.config.warm_start.demo_store, ctx.resources.run_dir)
    if ctx.rank == 0:
        try:
            ensure_demonstrations(ctx.resources.simulator_pool, store_path, ws.num_demos, ws.demo_init_state_offset,
                                  demo_env_attrs(sim), num_tasks=len(sim.task_names()) if sim.multi_task else None)
        except RuntimeError as err:
            if type(err) is not RuntimeError or "scripted expert produced" not in str(err):
                raise  # another failure (a Ray error carrying a simulator's exception, a store's)
            raise too_few_demonstrations(err, sim) from None
    cpu_barrier(ctx.group)
    obs, actions = demonstrations(TrajectoryStore.open(store_path), ws.num_demos, ctx.resources.policy.bc_chunk_size)
    return NodeOutput(TensorDict({keys.OBS: obs, keys.ACTIONS: actions}, batch_size=[len(actions)]), {})


@register_node("actor", "model_train", name="behaviour_cloning", reads=DEMO_KEYS,
               resources=("policy", "simulator_pool"), check=_clones_float32_weights, phases=("warm_start",))
def clone_behaviour(ctx, batch) -> NodeOutput:
    """Behaviour cloning on the transitions (``warm_start`` settings; the first observations of
    ``warm_start.norm_init_states`` training states join the normalisation statistics)."""
    from vla_rl.trainers.warm_start import behaviour_cloning, initial_observations

    ws, sim = ctx.config.warm_start, ctx.config.simulator
    if len(batch) == 0:
        return NodeOutput(None, {})
    init_obs = initial_observations(ctx.resources.simulator_pool, ws.norm_init_states,
                                    len(sim.task_names()) if sim.multi_task else None)
    metrics = behaviour_cloning(ctx.resources.policy, batch[keys.OBS], batch[keys.ACTIONS], ws.bc_steps, ws.bc_lr,
                                ws.bc_batch_size, seed=ctx.config.run.seed, extra_norm_obs=init_obs,
                                progress=ctx.rank == 0 and worker_bars(), obs_std_floor=ws.obs_std_floor)
    _rank_zeros_weights_everywhere(ctx)
    return NodeOutput(None, metrics)


def _rank_zeros_weights_everywhere(ctx) -> None:
    """Every worker warm-starts its own policy alike (same data, same seed), which gives the same
    weights only where the kernels are deterministic: on GPUs the cuBLAS/cuDNN reductions and
    attention backward passes are not, and a few hundred Adam steps amplify their rounding. The
    actor's strategy starts from rank 0's weights, but the reference (built from each worker's own
    policy before it) and the first evaluation would not; so rank 0's trained weights (and
    buffers: the normalisation statistics) are broadcast here, as DDP does at construction. The
    frozen ones (a LoRA run's base model) were loaded alike and never trained: not moved."""
    from vla_rl.trainers.strategy import broadcast_module

    if ctx.world_size > 1:
        broadcast_module(ctx.resources.policy, ctx.group, trainable_only=True)


@register_node("data", "data_load", name="sft_examples", writes=SFT_KEYS, resources=("policy", "text_assets"),
               phases=("warm_start",))
def load_sft_examples(ctx, batch) -> NodeOutput:
    """Every training row as a prompt/target pair: the keys of the ``sft`` data node (targets
    right-padded, ending in EOS); empty with ``text.sft_steps: 0``."""
    from vla_rl.data.prompt_dataset import PromptFile
    from vla_rl.trainers.sft import encode_sft_examples

    text = ctx.config.text
    if text.sft_steps == 0:
        return NodeOutput(TensorDict({}, batch_size=[0]), {})
    rows = PromptFile(ctx.resources.text_assets.train_file).read_shard(0, 1, extra_columns=[text.sft_response_column])
    examples = encode_sft_examples(ctx.resources.policy, rows, text.sft_response_column)
    return NodeOutput(TensorDict({
        keys.INPUT_IDS: examples.input_ids, keys.ATTENTION_MASK: examples.attention_mask,
        keys.UID: torch.tensor([row.index for row in rows], dtype=torch.int64),
        keys.RESPONSES: examples.responses, keys.RESPONSE_MASK: examples.response_mask,
    }, batch_size=[len(rows)]), {})


@register_node("actor", "model_train", name="supervised_fine_tune", reads=SFT_KEYS, resources=("policy",),
               check=_fine_tunes_float32_weights, phases=("warm_start",),
               settings=("text.sft_steps", "text.sft_lr", "text.sft_batch_size"))
def fine_tune(ctx, batch) -> NodeOutput:
    """``text.sft_steps`` of :func:`~vla_rl.trainers.sft.supervised_fine_tune` (``text.sft_lr``,
    ``text.sft_batch_size``, in micro-batches of ``trainer.micro_batch_size`` rows) on the examples."""
    from vla_rl.trainers.sft import SFTConfig, SFTExamples, supervised_fine_tune

    text = ctx.config.text
    if len(batch) == 0:
        return NodeOutput(None, {})
    examples = SFTExamples(batch[keys.INPUT_IDS], batch[keys.ATTENTION_MASK], batch[keys.RESPONSES],
                           batch[keys.RESPONSE_MASK])
    config = SFTConfig(steps=text.sft_steps, batch_size=text.sft_batch_size, lr=text.sft_lr, seed=ctx.config.run.seed,
                       micro_batch_size=ctx.config.trainer.micro_batch_size)
    metrics = supervised_fine_tune(ctx.resources.policy, examples, config).metrics()
    _rank_zeros_weights_everywhere(ctx)
    return NodeOutput(None, metrics)
