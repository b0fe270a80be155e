"""Environment steps per second of the simulator pool against one process and gymnasium's
``AsyncVectorEnv``, and the share of a training step that the simulator processes spend simulating.

Throughput, for each of ``--simulators`` (``lift``: robosuite Lift, Panda, OSC_POSE; ``metaworld``:
the MetaWorld task ``--metaworld-task``, reach-v3 by default), random actions in [-1, 1]; ``state``:
the state observation (Lift's 11 values when it was measured, 15 since the hand's orientation joined it;
MetaWorld's 39); ``camera``: plus one 128x128 frame
(Lift's ``agentview``, MetaWorld's ``corner``) rendered after every step and returned to the caller.
Rows:

- one process: a plain loop over ``--envs-per-process`` environments in one process, alone;
- the limit: the number of cores (or of processes, if fewer) times the one-process rate;
- ``--processes`` plain loops at once, without synchronisation: what the cores deliver together
  (the ceiling of any vectorisation; below the limit when processes slow each other down);
- ``gymnasium.vector.AsyncVectorEnv`` with the same processes and environments (each
  sub-environment hosts ``--envs-per-process`` environments and steps them in turn;
  the plain loops run in these processes too), with the same policy latencies (waited before each
  vector step);
- the project's :class:`simulators.pool.SimulatorPool` (``--processes`` actors x
  ``--envs-per-process`` environments) driven by :func:`vla_rl.rollout.embodied.rollout_episodes`
  with a uniform random policy (chunks of ``--chunk-size`` actions per call, 1 by default), for
  each ``--stages`` (1: lockstep; 2+: pipelined); with
  ``--policy-latency-ms`` (state only) also with a policy that waits that long per call (an
  accelerator's inference time, which pipelining hides).

Every row steps each environment ``--steps`` control steps (``--camera-steps`` with the camera;
MetaWorld, about ten times faster per step, ``--metaworld-steps`` without the camera); environment
creation is not timed. Each setting is timed ``--repeats`` times (settings of one
kind taking turns) and the best rate is kept, the run least disturbed by other processes on a
shared machine; every rate is in the JSON. Pool rows also report the simulation share: the wall
time the actors spent inside ``env.step`` / ``render_frame`` over (actors x wall time), and the
CPU share: the CPU time they used meanwhile over the same (lower when other processes take the
cores).

Training step (``--train-steps`` > 0): ``vla-rl train embodied_grpo`` through the DAG engine
(real MLP policy after a short behaviour-cloning warm start) with ``--train-states`` initial states
x ``--group-size`` episodes per step; the share of each step's wall time the simulator actors
spend simulating: ``rollout/sim_seconds_per_actor / timing/step`` (and the CPU share with
``rollout/sim_cpu_seconds_per_actor``), averaged over the steps after the first.

    flock /tmp/vla_heavy.lock python benchmarks/simulator_pool.py --out benchmarks/simulator_pool.json
"""

from __future__ import annotations

import os

# One BLAS thread per process, as the pool's actors have, and one Mesa llvmpipe rendering thread,
# so that the one-process rate uses one core and cores x that rate is the limit (processes started
# by this one, Ray's and AsyncVectorEnv's, inherit these).
for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "LP_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

LIFT = "robosuite_lift"
METAWORLD = "metaworld"
CAMERAS = {LIFT: "agentview", METAWORLD: "corner"}
"""The camera of each simulator's ``camera`` rows."""
SIMULATOR_NAMES = {"lift": LIFT, "metaworld": METAWORLD}
"""``--simulators`` choices -> registered simulator names."""


def env_config(simulator: str, obs: str, horizon: int, args) -> dict:
    """The simulator's config for one throughput part (a mapping of its config fields)."""
    config = {"horizon": horizon}
    if simulator == METAWORLD:
        config["task"] = args.metaworld_task
    if obs == "camera":
        config.update(render_camera=CAMERAS[simulator], render_size=128, fast_rendering=args.fast_rendering)
    return config


def part_steps(simulator: str, obs: str, args) -> int:
    """Control steps per environment of one throughput part."""
    if obs == "camera":
        return args.camera_steps
    return args.metaworld_steps if simulator == METAWORLD else args.steps


class EnvBatch(gym.Env):
    """``count`` environments of ``simulator`` stepped in turn, as one gymnasium environment for
    ``AsyncVectorEnv``: actions ``(count, action_dim)``, observations stacked (states, or the camera
    frames). Environments whose episode ends are reset inside; the batch itself never ends."""

    def __init__(self, simulator: str, config: dict, count: int) -> None:
        from simulators import make_env

        self.envs = [make_env(simulator, config) for _ in range(count)]
        self.render_frames = config.get("render_camera") is not None
        env = self.envs[0]
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(count, env.action_dim), dtype=np.float32)
        if self.render_frames:
            size = config["render_size"]
            self.observation_space = gym.spaces.Box(0, 255, shape=(count, size, size, 3), dtype=np.uint8)
        else:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(count, env.obs_dim), dtype=np.float32)
        self._seed = 0
        self.index = 0

    def _observe(self, env, obs):
        return env.render_frame() if self.render_frames else obs

    def reset(self, *, seed=None, options=None):
        self._seed = 0 if seed is None else int(seed) * 1000
        observations = []
        for env in self.envs:
            self._seed += 1
            observations.append(self._observe(env, env.reset(seed=self._seed)[0]))
        return np.stack(observations), {}

    def step(self, actions):
        observations = []
        for env, action in zip(self.envs, actions):
            obs, _, terminated, truncated, _ = env.step(action)
            observations.append(self._observe(env, obs))
            if terminated or truncated:
                self._seed += 1
                env.reset(seed=self._seed)
        return np.stack(observations), 0.0, False, False, {}

    def timed_loop(self, steps: int, runners: int) -> float | None:
        """A plain loop of ``steps`` steps over this batch's environments if this is one of the
        first ``runners`` sub-environments (``index`` set by the vector env's owner); its rate."""
        if self.index >= runners:
            return None
        rng = np.random.default_rng(self.index)
        start = time.perf_counter()
        for _ in range(steps):
            self.step(rng.uniform(-1, 1, size=self.action_space.shape).astype(np.float32))
        return len(self.envs) * steps / (time.perf_counter() - start)

    def close(self):
        for env in self.envs:
            env.close()


def best(runs: list[dict]) -> dict:
    """The run with the highest rate (the least disturbed by other processes), with every rate."""
    top = dict(max(runs, key=lambda run: run["steps_per_s"]))
    top["all_steps_per_s"] = [run["steps_per_s"] for run in runs]
    return top


def stepping_run(step, envs: int, steps: int, latency_ms: float) -> dict:
    """Time ``steps`` calls of ``step`` (each stepping ``envs`` environments), each after
    ``latency_ms`` of waiting for the policy."""
    start = time.perf_counter()
    for _ in range(steps):
        if latency_ms:
            time.sleep(latency_ms / 1000)
        step()
    seconds = time.perf_counter() - start
    return {"env_steps": envs * steps, "seconds": seconds, "steps_per_s": envs * steps / seconds}


class RandomPolicy:
    """Uniform random actions in [-1, 1] (chunks of ``chunk_size``, in the simulator's units),
    optionally waiting ``latency_s`` per call."""

    has_action_distribution = True

    def __init__(self, action_dim: int, latency_s: float, chunk_size: int = 1) -> None:
        import torch

        self.action_dim, self.latency_s, self.chunk_size = action_dim, latency_s, chunk_size
        self.own_action_dim = action_dim  # its actions are the simulator's
        self.device = torch.device("cpu")  # where the rollout puts its observations

    def eval(self) -> RandomPolicy:
        """No training mode to leave (the rollout puts every policy in eval mode)."""
        return self

    def sample_actions(self, obs, greedy=False, generator=None):
        import torch

        if self.latency_s:
            time.sleep(self.latency_s)
        actions = torch.rand(obs.shape[0], self.chunk_size, self.action_dim, generator=generator) * 2 - 1
        return actions, torch.zeros(obs.shape[0], self.chunk_size)

    def env_actions(self, actions, obs=None):
        return actions


def pool_run(pool, n: int, render: tuple[int, ...], stages: int, latency_ms: float, generator,
             chunk_size: int = 1) -> dict:
    """One rollout of ``n`` episodes (of ``horizon`` steps) of the random policy in ``pool``."""
    from vla_rl.rollout.embodied import rollout_episodes

    policy = RandomPolicy(pool.spec().action_dim, latency_ms / 1000, chunk_size)
    start = time.perf_counter()
    result = rollout_episodes(policy, pool, np.arange(n), generator=generator, render_indices=render,
                              pipeline_stages=stages)
    seconds = time.perf_counter() - start
    return {"env_steps": result.env_steps, "seconds": seconds, "steps_per_s": result.env_steps / seconds,
            "sim_share": result.sim_seconds / (pool.num_actors * seconds),
            "sim_cpu_share": result.sim_cpu_seconds / (pool.num_actors * seconds)}


def throughput(simulator: str, obs: str, args, cores: int) -> dict:
    """Every setting of one simulator and observation kind. All of them are created first (environment creation
    is not timed), then they take turns ``--repeats`` times so that all meet the same load.

    The plain loops run inside the ``AsyncVectorEnv``'s processes (through ``call``): one alone
    (the one-process rate), and all at once without synchronisation (what the cores deliver
    together, the ceiling of any vectorisation)."""
    import torch

    from simulators.pool import SimulatorPool

    steps = part_steps(simulator, obs, args)
    config = env_config(simulator, obs, steps, args)
    latencies = [0.0] + ([args.policy_latency_ms] if obs == "state" and args.policy_latency_ms > 0 else [])
    n = args.processes * args.envs_per_process
    rng = np.random.default_rng(0)
    vector = gym.vector.AsyncVectorEnv(
        [functools.partial(EnvBatch, simulator, config, args.envs_per_process)] * args.processes, context="spawn"
    )
    vector.set_attr("index", list(range(args.processes)))
    vector.reset(seed=0)
    pool = SimulatorPool(simulator, config, num_actors=args.processes, envs_per_actor=args.envs_per_process,
                         actor_options={"num_cpus": 0})
    pool.reset(np.arange(n))  # waits until the environments exist
    render = tuple(range(n)) if config.get("render_camera") else ()
    generator = torch.Generator().manual_seed(0)

    def plain_loops(runners: int) -> dict:
        start = time.perf_counter()
        rates = [rate for rate in vector.call("timed_loop", steps, runners) if rate is not None]
        seconds = time.perf_counter() - start
        return {"env_steps": runners * args.envs_per_process * steps, "seconds": seconds,
                "steps_per_s": float(sum(rates)), "process_steps_per_s": rates}

    def vector_step():
        vector.step(rng.uniform(-1, 1, size=vector.action_space.shape).astype(np.float32))

    settings = {("one_process", 0.0, None): functools.partial(plain_loops, 1),
                ("parallel_plain_loops", 0.0, None): functools.partial(plain_loops, args.processes)}
    for latency in latencies:
        settings[("async_vector_env", latency, None)] = functools.partial(stepping_run, vector_step, n, steps, latency)
    for latency in latencies:
        for count in args.stages:
            settings[("pool", latency, count)] = functools.partial(pool_run, pool, n, render, count, latency, generator,
                                                                   args.chunk_size)
    vector_step()  # warm-up
    runs: dict[tuple, list] = {key: [] for key in settings}
    try:
        for _ in range(args.repeats):
            for key, fn in settings.items():
                runs[key].append(fn())
    finally:
        vector.close()
        pool.close()

    label = "robosuite Lift" if simulator == LIFT else f"MetaWorld {config['task']}"
    result: dict = {"simulator": simulator, "label": label, "env": config, "obs": obs, "steps_per_env": steps,
                    "one_process": best(runs.pop(("one_process", 0.0, None))),
                    "parallel_plain_loops": best(runs.pop(("parallel_plain_loops", 0.0, None)))}
    result["limit_steps_per_s"] = min(cores, args.processes) * result["one_process"]["steps_per_s"]
    for (name, latency, count), rows in runs.items():
        pool_keys = {"stages": count, "chunk_size": args.chunk_size} if name == "pool" else {}
        row = {"policy_latency_ms": latency, **pool_keys, **best(rows)}
        result.setdefault(name, []).append(row)
    baseline = {row["policy_latency_ms"]: row["steps_per_s"] for row in result["async_vector_env"]}
    ceiling = result["parallel_plain_loops"]["steps_per_s"]
    for row in result["async_vector_env"] + result["pool"]:
        row["of_limit"] = row["steps_per_s"] / result["limit_steps_per_s"]
        row["of_parallel_plain_loops"] = row["steps_per_s"] / ceiling
        row["vs_async_vector_env"] = row["steps_per_s"] / baseline[row["policy_latency_ms"]]
    return result


def training_share(args, stages: int, out_dir: Path) -> dict:
    """Simulation share of the steps of a short ``embodied_grpo`` run."""
    from rich.console import Console

    from vla_rl.driver import train

    name = f"train_stages{stages}"
    overrides = [
        f"trainer.total_steps={args.train_steps}", f"trainer.save_every={args.train_steps}",
        f"data.init_states_per_step={args.train_states}", f"data.group_size={args.group_size}",
        f"simulator.pipeline_stages={stages}", f"simulator.actors_per_worker={args.actors_per_worker}",
        "eval.num_episodes=0", "warm_start.num_demos=1", "warm_start.bc_steps=200",
        f"run.output_dir={out_dir}", f"run.name={name}",
    ]
    train("embodied_grpo", overrides, console=Console(quiet=True))
    records = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "timing/step" in r]
    shares = [r["rollout/sim_seconds_per_actor"] / r["timing/step"] for r in steps]
    cpu_shares = [r["rollout/sim_cpu_seconds_per_actor"] / r["timing/step"] for r in steps]
    later = slice(1, None) if len(steps) > 1 else slice(None)  # the first step also pays for lazy set-up
    return {"stages": stages, "steps": len(steps), "episodes_per_step": args.train_states * args.group_size,
            "step_seconds": [r["timing/step"] for r in steps], "rollout_seconds": [r["timing/rollout"] for r in steps],
            "share_per_step": shares, "share": float(np.mean(shares[later])),
            "cpu_share_per_step": cpu_shares, "cpu_share": float(np.mean(cpu_shares[later]))}


def print_tables(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=150)
    for part in result["throughput"]:
        table = Table(title=f"{part['label']}, {part['obs']} observations, {part['steps_per_env']} steps per env: "
                            f"environment steps per second ({result['processes']} processes x "
                            f"{result['envs_per_process']} envs, {result['cores']} cores)")
        for column in ("setting", "policy ms", "steps/s", "of limit", "of parallel loops", "vs AsyncVectorEnv",
                       "sim share", "sim CPU share"):
            table.add_column(column, justify="left" if column == "setting" else "right")
        limit, ceiling = part["limit_steps_per_s"], part["parallel_plain_loops"]["steps_per_s"]
        table.add_row("one process (plain loop, alone)", "", f"{part['one_process']['steps_per_s']:.1f}")
        table.add_row("limit (min(cores, processes) x one process)", "", f"{limit:.1f}", "1.00")
        table.add_row(f"{result['processes']} plain loops at once", "", f"{ceiling:.1f}", f"{ceiling / limit:.2f}",
                      "1.00")
        labelled = [("AsyncVectorEnv (same processes)", row) for row in part["async_vector_env"]]
        for row in part["pool"]:
            label = "pool, lockstep" if row["stages"] == 1 else f"pool, pipelined ({row['stages']} stages)"
            chunk = row.get("chunk_size", 1)
            labelled.append((label + (f", chunks of {chunk}" if chunk > 1 else ""), row))
        for label, row in labelled:
            shares = [f"{row[key]:.2f}" for key in ("sim_share", "sim_cpu_share") if key in row]
            table.add_row(label, f"{row['policy_latency_ms']:g}", f"{row['steps_per_s']:.1f}", f"{row['of_limit']:.2f}",
                          f"{row['of_parallel_plain_loops']:.2f}", f"{row['vs_async_vector_env']:.2f}", *shares)
        console.print(table)
    if result["training"]:
        table = Table(title="embodied_grpo training steps: share of wall time the simulator actors simulate")
        for column in ("pipeline stages", "episodes/step", "step seconds", "rollout seconds", "share per step",
                       "share (steps 2+)", "CPU share per step", "CPU share (steps 2+)"):
            table.add_column(column)
        for row in result["training"]:
            table.add_row(str(row["stages"]), str(row["episodes_per_step"]),
                          " ".join(f"{s:.1f}" for s in row["step_seconds"]),
                          " ".join(f"{s:.1f}" for s in row["rollout_seconds"]),
                          " ".join(f"{s:.2f}" for s in row["share_per_step"]), f"{row['share']:.2f}",
                          " ".join(f"{s:.2f}" for s in row["cpu_share_per_step"]), f"{row['cpu_share']:.2f}")
        console.print(table)
    console.print(f"load average before {result['load_before']}, after {result['load_after']}; "
                  f"wall time {result['wall_seconds']:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    cores = len(os.sched_getaffinity(0))
    parser.add_argument("--simulators", nargs="*", choices=list(SIMULATOR_NAMES), default=list(SIMULATOR_NAMES),
                        help="simulators of the throughput parts (none: only the training part)")
    parser.add_argument("--metaworld-task", default="reach-v3", help="MetaWorld v3 task of the metaworld parts")
    parser.add_argument("--obs", nargs="*", choices=["state", "camera"], default=["state", "camera"],
                        help="throughput parts to run for each simulator (none: only the training part)")
    parser.add_argument("--processes", type=int, default=cores, help="pool actors / AsyncVectorEnv processes")
    parser.add_argument("--envs-per-process", type=int, default=8)
    parser.add_argument("--steps", type=int, default=50, help="control steps per environment (state)")
    parser.add_argument("--camera-steps", type=int, default=10, help="control steps per environment (camera)")
    parser.add_argument("--metaworld-steps", type=int, default=400,
                        help="control steps per environment (MetaWorld, state)")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per setting (interleaved); best kept")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2], help="pipeline stages of the pool rows")
    parser.add_argument("--chunk-size", type=int, default=1,
                        help="actions per policy call in the pool rows (a VLA chunk; AsyncVectorEnv steps one)")
    parser.add_argument("--policy-latency-ms", type=float, default=10.0,
                        help="extra state rows with a policy that takes this long per call (0: none)")
    parser.add_argument("--fast-rendering", action="store_true", help="camera without shadows and reflections")
    parser.add_argument("--train-steps", type=int, default=2, help="training steps measured (0: skip)")
    parser.add_argument("--train-stages", type=int, nargs="+", default=[1], help="pipeline stages of the runs")
    parser.add_argument("--train-states", type=int, default=2, help="initial states per training step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--actors-per-worker", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None,
                        help="write the JSON record there (default: none; the tables are printed)")
    args = parser.parse_args()

    from vla_rl.utils.ray_utils import init_ray

    started = time.perf_counter()
    result = {"cores": cores, "processes": args.processes, "envs_per_process": args.envs_per_process,
              "load_before": [round(x, 2) for x in os.getloadavg()],
              "args": {k: v if not isinstance(v, Path) else str(v) for k, v in vars(args).items()}}
    init_ray(num_cpus=16)
    result["throughput"] = [throughput(SIMULATOR_NAMES[kind], obs, args, cores)
                            for kind in args.simulators for obs in args.obs]
    with tempfile.TemporaryDirectory() as tmp:
        result["training"] = [training_share(args, stages, Path(tmp)) for stages in args.train_stages
                              if args.train_steps > 0]
    result["load_after"] = [round(x, 2) for x in os.getloadavg()]
    result["wall_seconds"] = time.perf_counter() - started
    print_tables(result)
    if args.out is None:
        print("no JSON record written (give --out FILE to keep one)")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
