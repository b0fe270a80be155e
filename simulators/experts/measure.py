"""Measure how many control steps a scripted expert's demonstrations take: the numbers behind each
expert's ``measured_steps`` (:class:`~simulators.experts.registry.ExpertSteps`), which the planner
compares with a run's ``simulator.env.horizon`` (:func:`~simulators.experts.registry.horizon_problem`).

    python -m simulators.experts.measure robosuite '{"task": "PickPlaceCan", "robot": "Sawyer"}' --episodes 20
    python -m simulators.experts.measure metaworld '{"task": "shelf-place-v3"}' --episodes 20 --horizon 500

Episodes run one after another in this process from the demonstration initial states
(``warm_start.demo_init_state_offset`` = 2,000,000,000 onwards), as the ``demonstrations`` node
runs them, with a horizon far above the expert's needs (default 400 control steps).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from simulators.experts.registry import ExpertSteps, make_expert
from simulators.registry import make_env

DEMO_INIT_STATE_OFFSET = 2_000_000_000
"""The default first demonstration initial state (``warm_start.demo_init_state_offset``)."""


def expert_episode_steps(simulator: str, env: dict, episodes: int, offset: int = DEMO_INIT_STATE_OFFSET
                         ) -> list[int | None]:
    """Control steps of the expert's episodes from initial states ``offset + [0, episodes)``: the
    steps to success, or None where an episode ended unsuccessful at ``env``'s horizon."""
    environment = make_env(simulator, env)
    try:
        expert = make_expert(simulator, environment.config.task_name, environment.obs_layout)
        steps: list[int | None] = []
        for seed in range(offset, offset + episodes):
            obs, _ = environment.reset(seed=seed)
            expert.reset()
            while True:
                obs, _, terminated, truncated, info = environment.step(expert.act(obs))
                if terminated or truncated:
                    break
            steps.append(int(info["episode_step"]) if info["success"] else None)
        return steps
    finally:
        environment.close()


def summarize(steps: list[int | None]) -> ExpertSteps:
    """The :class:`ExpertSteps` of a list from :func:`expert_episode_steps`."""
    done = [s for s in steps if s is not None]
    if not done:
        return ExpertSteps(successes=0, episodes=len(steps))
    return ExpertSteps(successes=len(done), episodes=len(steps), fewest=min(done), median=int(np.median(done)),
                       most=max(done))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("simulator", help="registered simulator name, e.g. robosuite, metaworld")
    parser.add_argument("env", help='the simulator config as JSON, e.g. {"task": "Lift", "robot": "Sawyer"}')
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--horizon", type=int, default=400)
    parser.add_argument("--offset", type=int, default=DEMO_INIT_STATE_OFFSET)
    args = parser.parse_args(argv)
    env = {"horizon": args.horizon, **json.loads(args.env)}
    steps = expert_episode_steps(args.simulator, env, args.episodes, args.offset)
    print(json.dumps({"simulator": args.simulator, "env": env, "steps": steps, **vars(summarize(steps))}))


if __name__ == "__main__":
    main()
