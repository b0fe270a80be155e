"""Pre-flight checks of a run's input files, on the driver, before Ray starts and before anything
is written to disk.

Without them every bad file shows up in a worker, tens of seconds into a run, as a remote
traceback beside a half-made run directory, and some never show up at all (a model directory
without its tokenizer files trains on empty prompts; weights whose names do not match the
architecture leave it randomly initialised). :func:`preflight` checks what the template names:

- **prompt files** (``text.train_file``, ``text.test_file``; when one is null, the arithmetic
  splits the run would generate, written to a temporary directory and checked the same way): the
  file exists and is readable (parquet: magic bytes and footer; JSONL: every line UTF-8 JSON), the
  columns the run reads exist (``prompt``, ``data_source``, ``reward_model.ground_truth``, and
  ``text.sft_response_column`` for supervised warm starts), and every DP shard of each node that
  reads the training file holds at least ``text.prompts_per_step // dp_size`` rows (the test file:
  a row group per worker; with dynamic sampling, ``1 + max_refill_rounds`` times as many), from
  the parquet metadata alone;
- **the rows of the prompt files the run reads**, streamed in batches: every row's
  ``data_source`` has a verifier (where the rows are scored: a reward node, the evaluation), and
  every prompt fits ``text.max_prompt_length`` tokens, encoded as the workers encode it (the
  policy's processor renders the chat template, or the raw text, and the model's tokenizer, or the
  generated tiny model's, counts the tokens). A prompt too long is refused, not truncated (TRL
  truncates and logs a count): a truncated prompt loses its start, and the workers would refuse
  it at their first step anyway;
- **model checkpoints** (``text.model_path`` / ``text.gguf_file``; ``policy.config.model_path`` of
  the policies that load one, OpenVLA, OpenVLA-OFT and π0, and π0's ``policy.config.tokenizer_path``):
  no custom code named in the configuration files (``auto_map``: nothing from a model directory
  ever runs), the architecture's file (``config.json``; π0's ``pi0_architecture.json`` or
  ``config.json``), a usable tokenizer (with a chat template for chat prompts), whole safetensors
  headers whose tensor names and shapes match the architecture built on the ``meta`` device, no
  pickle weights unless allowed, and the files beside them that the policy reads (OFT's head
  modules, their tensor shapes against the config's; OpenVLA's statistics of an explicit
  ``unnorm_key``; π0's ``norm_stats.json`` and Flow-Noise head); a GGUF file's header (version, key-value
  metadata, tensor infos whose data lies inside the file) and its tokenizer;
- **the trajectory encoder's model** (V-JEPA 2's ``algorithm.vjepa2.model_dir``: its
  ``config.json``), when the reward embeds episodes with it;
- **a task set's tasks** (``simulator.tasks``) declare the same state and action sizes and horizon;
- **the simulator actors per worker** (``simulator.actors_per_worker``) are no more than the
  environments of a worker's pool, each actor running at least one;
- **LoRA's settings** (``policy.lora``): the adapters injected into the policy built on the
  ``meta`` device, where its architecture is known from the config (a text model directory, the
  tiny text model a run generates, OpenVLA and OpenVLA-OFT): each ``target_modules`` name names a
  trainable linear layer, each ``trainable_modules`` entry a submodule, and ``rank`` is at most
  the largest full rank of the layers it adapts;
- **the worker resources the nodes declare** (a plug-in's ``register_node(resources=...)``) and
  those they need are registered.

:func:`check_local_packages` (``vla-rl train`` and ``eval``, not ``plan``) adds the optional
packages a local run's workers import: the simulator's extra (LIBERO) and vLLM.

A problem is a :class:`PreflightError` naming the config field and the file, which the command
line prints as one line (exit status 2). The checks reuse the loaders' own code
(:class:`~vla_rl.data.prompt_dataset.PromptFile`, :func:`policies.causal_lm.loading.check_pretrained`,
the policies' ``check_pretrained``), so what passes here loads in the workers.

The checks live beside this module: :mod:`vla_rl.preflight.text` (a text run's prompts and model),
:mod:`vla_rl.preflight.embodied` (an embodied run's tasks, simulator, policy checkpoint and
trajectory encoder), :mod:`vla_rl.preflight.lora` (LoRA's settings),
:mod:`vla_rl.preflight.errors` (:class:`PreflightError`).
"""

from __future__ import annotations

from pathlib import Path

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import Template
from vla_rl.dag.planner import Plan, RunNode, plan
from vla_rl.preflight.embodied import check_embodied_inputs, check_simulator, simulator_unavailable
from vla_rl.preflight.errors import PreflightError
from vla_rl.preflight.lora import check_lora
from vla_rl.preflight.text import check_text_inputs

__all__ = ["PreflightError", "check_local_packages", "check_simulator", "preflight", "simulator_unavailable"]


def preflight(template: Template, world_size: int | None = None) -> None:
    """Check the files the run will read (see the module docstring); writes nothing outside a
    temporary directory (the generated prompts, deleted on return).

    Args:
        template: a loaded (validated) template.
        world_size: the number of DAG workers (default ``workers.num_workers``).

    Raises:
        PreflightError: the first problem found.
        TemplateError: the template does not plan (see :func:`vla_rl.dag.planner.plan`).
    """
    config = template.config
    the_plan = plan(template, world_size)
    _check_node_resources(config, the_plan, template.path)
    if config.run.workflow == "text":
        check_text_inputs(config, the_plan)
    else:
        check_embodied_inputs(config, the_plan)
    check_lora(config)


def _check_node_resources(config, the_plan: Plan, file: Path) -> None:
    """Every worker resource a node declares (``register_node(resources=...)``) is registered,
    with the resources it needs, and none needs itself through its ``needs``: otherwise every
    worker would stop at its setup, after Ray and the simulators started, with a traceback that
    names no node."""
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.workers.resources import RESOURCES

    WORKFLOWS.get(config.run.workflow)  # the workflow kits register their resources on import
    for phase in the_plan.phases.values():
        for task in phase.chains[0]:
            if not isinstance(task, RunNode):
                continue
            for name in sorted(task.resources):
                problem = _resource_problem((name,), RESOURCES)
                if problem is not None:
                    raise TemplateError(f"its function ({task.role}/{task.type}, fn: {task.fn}) declares worker "
                                        f"resource {name!r}: {problem}", file=file, node=task.node_id, field="fn")


def _resource_problem(path: tuple[str, ...], resources) -> str | None:
    """Why the last resource of ``path`` (a declared one, then what each needs) cannot be built,
    or None."""
    name = path[-1]
    if name in path[:-1]:
        return f"the resources it needs need each other in a cycle: {' -> '.join(path)}"
    if name not in resources:
        through = "" if len(path) == 1 else f" (needed through {' -> '.join(path)})"
        return (f"{name!r}{through} is not registered; known: {', '.join(map(str, resources.names()))}. Register it "
                "with vla_rl.workers.resources.register_resource in a module of run.imports")
    for need in resources.get(name).needs:
        problem = _resource_problem((*path, need), resources)
        if problem is not None:
            return problem
    return None


def check_local_packages(config) -> None:
    """The optional packages the workers of a local run import, looked for on the driver's Python,
    which those workers share: the simulator's optional extra (its ``unavailable_reason``: LIBERO)
    and vLLM for ``text.rollout_backend: vllm``. A missing one is refused here, before Ray starts,
    rather than by every worker once started (measured on the 2-core machine: LIBERO after 21 s,
    vLLM after 2 min, each as a Ray traceback). Not checked for a run that joins a cluster
    (``workers.ray_address``, ``RAY_ADDRESS``), whose workers import from the cluster's
    environment, nor by ``vla-rl plan``, which may validate a run meant for another machine.

    Raises:
        PreflightError: naming the field that asks for the package (``simulator.name``,
            ``text.rollout_backend``) and how to install it.
    """
    import importlib.util

    from vla_rl.utils.ray_utils import cluster_address

    if cluster_address(config.workers.ray_address) is not None:
        return
    if config.run.workflow == "embodied":
        reason = simulator_unavailable(config.simulator.name)
        if reason is not None:
            raise PreflightError(reason, field="simulator.name")
    elif config.text.rollout_backend == "vllm" and importlib.util.find_spec("vllm") is None:
        from vla_rl.rollout.vllm_backend import vllm_missing_message

        raise PreflightError(vllm_missing_message("No module named 'vllm'"), field="text.rollout_backend")

