"""A remote-environment client process for tests/test_remote_training.py: ``--num-envs``
robosuite Lift environments served by RobotClients (as ``vla-rl remote-env robosuite_lift``
serves them), whose process exits at once (``os._exit``, as ``kill -9`` would end it) when its
environments have together received ``--die-after`` action chunks of training episodes (initial
states below 1e9; held-out evaluation episodes start there): mid-step, with episodes running.
Run with ``python -P`` (``tests/simulators`` must not shadow the ``simulators`` package).

    python -P tests/remote_dying_client.py URI TOKEN --num-envs 4 --horizon 20 --die-after 12
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import threading

import gymnasium as gym

from simulators import make_env
from vla_rl.remote import serve_envs

EVAL_INIT_STATES = 1_000_000_000


class DieAfter(gym.Wrapper):
    """Counts the training chunks its process's environments receive; the ``limit``-th ends the process."""

    counter = itertools.count(1)
    lock = threading.Lock()

    def __init__(self, env: gym.Env, limit: int) -> None:
        super().__init__(env)
        self.limit, self.training = limit, False

    def reset(self, *, seed=None, options=None):
        self.training = seed < EVAL_INIT_STATES
        return self.env.reset(seed=seed, options=options)

    def step(self, action):
        if self.training:
            with DieAfter.lock:
                if next(DieAfter.counter) >= self.limit:
                    os._exit(3)
        return self.env.step(action)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("token")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--horizon", type=int, default=20)
    parser.add_argument("--die-after", type=int, default=12)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # "connected to ..." once per environment
    envs = [DieAfter(make_env("robosuite_lift", {"horizon": args.horizon}), args.die_after)
            for _ in range(args.num_envs)]
    clients = serve_envs(envs, args.uri, args.token, retry_s=0.2)
    for client in clients:
        client.thread.join()


if __name__ == "__main__":
    main()
