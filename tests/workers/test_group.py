"""The driver's view of the DAG workers when one of them dies: WorkerGroup.collect names the dead
rank, also when a survivor's error (its collective with the dead rank failed) reaches the driver
first, and leaves other errors as they are."""

from __future__ import annotations

import os
import time

import pytest

from vla_rl.errors import RunStopped
from vla_rl.workers.group import WorkerDiedError, WorkerGroup


def rank_class():
    """A stand-in DAG worker class, defined in a function so that Ray ships it by value (the test
    module is not importable in Ray's worker processes)."""

    class Rank:
        """``work(plan)`` does what ``plan`` says for its rank."""

        def __init__(self, rank: int, fail_init: str | None = None) -> None:
            if fail_init == "error":
                raise ValueError("bad constructor argument")
            if fail_init == "stop":  # as the code-location check does
                raise RunStopped("a worker imported vla_rl from /a, the driver from /b")
            self.rank = rank

        def node_id(self) -> str:
            return "node"

        def work(self, plan: dict) -> dict:
            action = plan.get(self.rank, "reply")
            if action.startswith("sleep "):
                time.sleep(float(action.split()[1]))
                action = "reply"
            if action == "die":
                os._exit(1)
            if action == "die later":
                time.sleep(1.0)
                os._exit(1)
            if action == "collective error":
                raise RuntimeError("[gloo] Connection closed by peer")
            if action == "stop":
                raise RunStopped("the run cannot go on: because")
            if action == "noted error":  # as run_node_function notes a node's exception
                error = ValueError("boom in a plug-in")
                error.add_note("raised in node 'penalty'")
                raise error
            if action == "allocate":  # 100 TB: torch's CPU allocator refuses it at once
                import torch

                try:
                    torch.empty(10**14, dtype=torch.uint8)
                except RuntimeError as error:
                    error.add_note("raised in node 'rollout' (function 'rollout' of (rollout, generate), from x)")
                    raise
            if action == "cuda out of memory":
                import torch

                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB. GPU 0 has a total "
                                             "capacity of 79.19 GiB of which 3.06 GiB is free.\nOf the allocated ...")
            if action == "disk full":
                import errno

                error = OSError(errno.ENOSPC, "No space left on device", "/runs/r/videos/final.tmp.mp4")
                error.add_note("raised in node 'eval_record' (function 'record' of (eval, record), from x)")
                raise error
            if action == "python out of memory":
                bytearray(2**62)
            return {"rank": float(self.rank)}

    return Rank


@pytest.fixture
def group(ray_on_loopback):
    ray = ray_on_loopback
    actor = ray.remote(num_cpus=0, max_restarts=0)(rank_class())
    workers = WorkerGroup([actor.remote(rank) for rank in range(2)])
    yield workers
    workers.kill()


def test_dead_rank_is_named(group):
    with pytest.raises(WorkerDiedError, match=r"DAG worker rank 1 died during 'work': pid \d+") as err:
        group.call("work", {0: "sleep 0.5", 1: "die"})
    assert err.value.rank == 1 and err.value.method == "work"


def test_death_is_found_behind_a_survivors_collective_error(group):
    with pytest.raises(WorkerDiedError, match="rank 1 died") as err:
        group.call("work", {0: "collective error", 1: "die later"})
    assert "Connection closed by peer" in str(err.value.__cause__)


def test_replies_and_errors_that_are_not_deaths(group):
    assert group.call("work", {}) == [{"rank": 0.0}, {"rank": 1.0}]
    with pytest.raises(RunStopped, match="^the run cannot go on: because$"):
        group.call("work", {1: "stop"})
    with pytest.raises(RuntimeError, match="Connection closed by peer") as err:
        group.call("work", {0: "collective error"})
    assert not isinstance(err.value, WorkerDiedError)
    assert group.call("work", {}) == [{"rank": 0.0}, {"rank": 1.0}]  # both still live


def test_a_workers_exception_note_is_shown_once(group):
    """Ray's error shows the worker's traceback, notes included, and its dual exception class
    hands the cause's ``__notes__`` on: the note naming the node was printed twice."""
    import traceback

    with pytest.raises(ValueError, match="boom in a plug-in") as err:
        group.call("work", {0: "noted error"})
    shown = "".join(traceback.format_exception(err.value))
    assert shown.count("raised in node 'penalty'") == 1, shown


def test_out_of_memory_is_one_line_naming_the_worker_and_node(group):
    """A worker out of memory stopped the run with Ray's traceback around the allocator's message
    (e.g. ``text.max_prompt_length=1000000000`` in ``llm_grpo``'s setup)."""
    with pytest.raises(RunStopped, match=r"^worker 1 ran out of memory in node 'rollout' \(work\): "
                                         r"DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                         r"100000000000000 bytes\. .*lower the one behind") as err:
        group.call("work", {1: "allocate"})
    assert "\n" not in str(err.value) and "enforce fail" not in str(err.value)
    with pytest.raises(RunStopped, match=r"^worker 0 ran out of memory in its work call: CUDA out of memory\. Tried "
                                         r"to allocate 20\.00 GiB\. GPU 0 .* is free\. The run's sizes"):
        group.call("work", {0: "cuda out of memory"})
    with pytest.raises(RunStopped, match=r"^worker 0 ran out of memory in its work call: MemoryError\. "):
        group.call("work", {0: "python out of memory"})
    assert group.call("work", {}) == [{"rank": 0.0}, {"rank": 1.0}]  # not a death: both still live


def test_a_write_the_file_system_refuses_is_one_line_naming_the_worker_node_and_file(group):
    with pytest.raises(RunStopped, match=r"^worker 1: the file system refused a write in node 'eval_record' \(work\): "
                                         r"No space left on device \(/runs/r/videos/final\.tmp\.mp4\)\. Free space "
                                         r"or fix the file system, then run the command again \(a training run: "
                                         r"vla-rl train --resume RUN_DIR continues from its last checkpoint\)$"):
        group.call("work", {1: "disk full"})
    assert group.call("work", {}) == [{"rank": 0.0}, {"rank": 1.0}]


def test_failed_constructor_is_not_a_death(ray_on_loopback):
    ray = ray_on_loopback
    actor = ray.remote(num_cpus=0, max_restarts=0)(rank_class())
    workers = WorkerGroup([actor.remote(0, fail_init="error")])
    with pytest.raises(ray.exceptions.RayActorError, match="bad constructor argument") as err:
        workers.call("work", {})
    assert not isinstance(err.value, WorkerDiedError)
    with pytest.raises(ray.exceptions.RayActorError, match="bad constructor argument"):
        workers.node_ids()


def test_a_constructor_that_stops_the_run_is_one_message(ray_on_loopback):
    """A worker whose constructor raises RunStopped (the code-location check on a cluster whose
    nodes import another copy): the driver's first call on the workers, node_ids, raised Ray's
    ActorDiedError, a traceback with the message inside; now the RunStopped, one line."""
    ray = ray_on_loopback
    actor = ray.remote(num_cpus=0, max_restarts=0)(rank_class())
    workers = WorkerGroup([actor.remote(0, fail_init="stop")])
    for call in (workers.node_ids, lambda: workers.call("work", {})):
        with pytest.raises(RunStopped) as err:
            call()
        assert str(err.value) == "a worker imported vla_rl from /a, the driver from /b"


def test_the_driver_counts_the_bytes_it_receives(group):
    import pickle

    replies = group.call("work", {})
    assert group.last_reply_bytes == sum(len(pickle.dumps(reply)) for reply in replies)
    assert group.max_reply_bytes == max(len(pickle.dumps(reply)) for reply in replies)


def test_a_sigterm_swallowed_before_the_wait_ends_it_within_a_second(group):
    """A SIGTERM whose exception was lost (a finalizer, an at-fork hook) left the driver waiting
    for its workers: the run went on as if none had come."""
    import signal

    from vla_rl.errors import Terminated
    from vla_rl.utils.signals import sigterm_as_interrupt

    with sigterm_as_interrupt():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except Terminated:
            pass  # swallowed
        started = time.monotonic()
        with pytest.raises(Terminated):
            group.call("work", {0: "sleep 20", 1: "sleep 20"})
    assert time.monotonic() - started < 15.0  # the call sleeps 20 s; the check runs every second


KILL_AFTER_RAY_DIED = """
import os, signal, sys, time
import ray
from vla_rl.utils.ray_utils import init_ray, local_ray_lost
from vla_rl.workers.group import WorkerGroup

init_ray(num_cpus=1)

@ray.remote(num_cpus=0)
class Worker:
    def ping(self):
        return 1

actor = Worker.remote()
ray.get(actor.ping.remote())
print("before", local_ray_lost(), flush=True)
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process
os.kill(raylet.pid, signal.SIGTERM)  # as a signal to the whole process group reaches it
raylet.wait(60)
print("after", local_ray_lost(), flush=True)
start = time.monotonic()
released = WorkerGroup([actor]).kill()
print("kill", released, round(time.monotonic() - start, 1), flush=True)
os._exit(0)  # Ray cannot shut down without its raylet
"""


def test_killing_the_workers_after_the_local_ray_died_returns_at_once(tmp_path):
    """`timeout`, Slurm and systemd send SIGTERM to the whole process group: Ray's raylet died
    with the driver's signal, and killing the workers' actors then waited a minute for it, after
    which Ray ended the process with status 1 (no error line, not 143)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KILL_AFTER_RAY_DIED], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)
    lines = [line for line in done.stdout.splitlines() if line.split(" ")[0] in ("before", "after", "kill")]
    assert lines[:2] == ["before []", "after ['raylet']"], done.stdout + done.stderr
    name, released, seconds = lines[2].split(" ")
    assert released == "False" and float(seconds) < 2.0


def test_a_kill_that_ray_does_not_finish_is_given_up(monkeypatch):
    """While Ray's processes are dying (the signal reached them too) its calls wait on them."""
    import threading

    import ray

    blocked = threading.Event()
    monkeypatch.setattr(ray, "kill", lambda actor: blocked.wait())
    start = time.monotonic()
    assert WorkerGroup(["actor"]).kill(timeout_s=0.3) is False
    assert time.monotonic() - start < 2.0
    blocked.set()
    monkeypatch.setattr(ray, "kill", lambda actor: None)
    assert WorkerGroup(["actor"]).kill(timeout_s=5.0) is True


def test_an_evaluation_reports_the_figures_of_all_its_passes():
    """The summary's eval/episode_length was the last pass's (the sampled protocol's, 100.0, beside
    a greedy 64.5), eval/recorded 4 of 8 episodes, eval/recorded_successes 0 of 2."""
    from vla_rl.workers.group import run_evaluation

    passes = [  # greedy: 4 episodes, 2 successes, lengths 64.5 on average; then sampled: 4, 0, 100
        {"eval/recorded": 4.0, "eval/recorded_successes": 2.0, "eval/remaining": 4.0, "eval/episode_length": 64.5,
         "eval/env_steps_per_episode": 64.5, "timing/eval_rollout": 1.5},
        {"eval/recorded": 4.0, "eval/recorded_successes": 0.0, "eval/remaining": 0.0, "eval/episode_length": 100.0,
         "eval/env_steps_per_episode": 100.0, "timing/eval_rollout": 2.0, "eval/greedy/success_rate": 0.5,
         "eval/greedy/episode_length": 64.5},
    ]

    class Workers:
        def call(self, method, *args):
            assert (method, args[0]) == ("run_phase", "evaluate")
            return [passes.pop(0)]

    seen = []
    metrics = run_evaluation(Workers(), 3, "final", False, progress=lambda m: seen.append(m["eval/remaining"]))
    assert seen == [4.0, 0.0] and metrics["eval/remaining"] == 0.0
    assert metrics["eval/recorded"] == 8.0 and metrics["eval/recorded_successes"] == 2.0
    assert metrics["eval/episode_length"] == pytest.approx((4 * 64.5 + 4 * 100.0) / 8)
    assert metrics["eval/env_steps_per_episode"] == pytest.approx(82.25)
    assert metrics["timing/eval_rollout"] == pytest.approx(3.5)
    assert metrics["eval/greedy/success_rate"] == 0.5 and metrics["eval/greedy/episode_length"] == 64.5
