"""SIGTERM handled as Ctrl-C is (vla_rl.utils.signals): in-process, while a command waits in Ray
(which raises a plain KeyboardInterrupt in its place), then a ``vla-rl train`` terminated while it
starts up and once Ray runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import vla_rl.cli.plan as plan_command
from vla_rl.cli import TERMINATED_STATUS, main
from vla_rl.errors import RunStopped, Terminated
from vla_rl.utils.signals import interrupts_deferred, raise_if_terminated, sigterm_as_interrupt, was_terminated


def test_sigterm_raises_terminated_within_the_block_only():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated), sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler runs at the next bytecode: never reached
    assert signal.getsignal(signal.SIGTERM) is before
    assert issubclass(Terminated, KeyboardInterrupt)  # every Ctrl-C path handles it


def test_a_ctrl_c_after_a_terminated_block_is_a_ctrl_c():
    with pytest.raises(Terminated) as raised, sigterm_as_interrupt():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert was_terminated(raised.value)
    with pytest.raises(KeyboardInterrupt) as raised, sigterm_as_interrupt():
        raise KeyboardInterrupt
    assert not was_terminated(raised.value)


def test_a_command_terminated_while_it_waits_in_ray_says_so(ray_on_loopback, monkeypatch, capsys):
    """The driver spends a run waiting in ``ray.wait``/``ray.get``; a SIGTERM there came out of Ray
    as a plain KeyboardInterrupt, and the command said "interrupted (Ctrl-C)" with status 130."""
    ray = ray_on_loopback

    @ray.remote(num_cpus=0)
    def sleep() -> None:
        time.sleep(60)

    ref = sleep.remote()

    def waits_in_ray(args) -> int:
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            ray.get(ref)
        finally:
            timer.cancel()  # never a SIGTERM outside the command (it would end pytest)
        return 0

    monkeypatch.setattr(plan_command, "run_plan", waits_in_ray)
    try:
        assert main(["plan", "embodied_srpo"]) == TERMINATED_STATUS
    finally:
        ray.cancel(ref, force=True)
    assert capsys.readouterr().err.strip() == "error: terminated (SIGTERM)"


def test_a_sigterm_while_ray_starts_is_raised_once_the_block_ends():
    """Raised inside ``ray.init``, the exception was swallowed ("Exception ignored" in an at-fork
    hook: the run went on) or ended the start half done: it waits for the block's end now."""
    ran_on = []
    with sigterm_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        with pytest.raises(Terminated), interrupts_deferred() as deferring:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            signal.signal(signal.SIGTERM, lambda *args: sys.exit(15))  # what ray.init does
            ran_on.append(deferring)
        assert ran_on == [True]
        assert signal.getsignal(signal.SIGTERM) is ours
    with sigterm_as_interrupt():
        with pytest.raises(Terminated) as raised, interrupts_deferred():  # the block's own error: from it
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            raise RunStopped("cannot join the Ray cluster")
        assert isinstance(raised.value.__cause__, RunStopped)
    with sigterm_as_interrupt():
        with interrupts_deferred():  # no SIGTERM: nothing raised
            pass
        assert signal.getsignal(signal.SIGTERM) is ours
    reached = []
    with sigterm_as_interrupt(), pytest.raises(Terminated), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        reached.append("first recorded")
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: at once (Ray may hang starting)
        time.sleep(5)
        reached.append("second recorded")
    assert reached == ["first recorded"]


def test_a_ctrl_c_while_ray_starts_is_raised_once_the_block_ends():
    """Raised inside ``ray.init``, a KeyboardInterrupt left Ray half started; the command then
    ended with a segmentation fault after its error line (exit status 139 for 130)."""
    ran = []
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt) as raised, interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
            ran.append("after the Ctrl-C")
        assert ran == ["after the Ctrl-C"] and not was_terminated(raised.value)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    reached = []
    with sigterm_as_interrupt(), pytest.raises(Terminated), interrupts_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        reached.append("Ctrl-C recorded")
        os.kill(os.getpid(), signal.SIGTERM)  # a second interrupt: at once, and a SIGTERM came
        time.sleep(5)
        reached.append("SIGTERM recorded")
    assert reached == ["Ctrl-C recorded"]


def test_a_ctrl_c_handler_other_than_python_s_is_left_alone():
    ignored = []
    previous = signal.signal(signal.SIGINT, lambda *args: ignored.append("theirs"))
    try:
        with sigterm_as_interrupt(), interrupts_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert ignored == ["theirs"]


def swallowed_sigterm() -> None:
    """A SIGTERM whose Terminated is lost, as in a finalizer the garbage collector runs."""
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    except Terminated:
        pass


def test_a_swallowed_sigterm_is_raised_again_where_the_command_checks():
    with sigterm_as_interrupt():
        raise_if_terminated()  # none came: nothing
        swallowed_sigterm()
        with pytest.raises(Terminated):
            raise_if_terminated()
        with pytest.raises(Terminated), interrupts_deferred():  # Ray does not start
            pytest.fail("the block ran")
    raise_if_terminated()  # the command's block ended (it handles the interrupt): nothing
    with sigterm_as_interrupt():  # the next command starts afresh
        raise_if_terminated()


def test_outside_a_command_interrupts_deferred_changes_nothing():
    before = signal.getsignal(signal.SIGTERM)
    with interrupts_deferred() as deferring:
        assert signal.getsignal(signal.SIGTERM) is before
    assert not deferring


_INTERRUPTED_IN_RAY_INIT = """
import os, signal, sys, time
import ray, ray._private.node
from vla_rl.utils.ray_utils import init_ray
from vla_rl.utils.signals import sigterm_as_interrupt

start_node = ray._private.node.Node.__init__
def interrupted_meanwhile(*args, **kwargs):
    os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    time.sleep(0.2)
    start_node(*args, **kwargs)
ray._private.node.Node.__init__ = interrupted_meanwhile
try:
    with sigterm_as_interrupt():
        init_ray(num_cpus=1)
except KeyboardInterrupt as interrupt:
    print(type(interrupt).__name__, "; Ray started:", ray.is_initialized())
    ray.shutdown()
"""


@pytest.mark.e2e
@pytest.mark.parametrize(("signum", "raised"), [("SIGTERM", "Terminated"), ("SIGINT", "KeyboardInterrupt")])
def test_an_interrupt_in_the_middle_of_ray_init_is_raised_after_it(signum, raised):
    """With Ray's own handler, a SIGTERM ended ray.init in ``SystemExit: 15`` (status 15, no message
    and Ray half started) or, raised in an at-fork hook, was ignored; a Ctrl-C left Ray half started."""
    done = subprocess.run([sys.executable, "-c", _INTERRUPTED_IN_RAY_INIT, signum], capture_output=True, text=True,
                          timeout=120, preexec_fn=_default_handlers)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"{raised} ; Ray started: True"


def _default_handlers() -> None:
    """In the child: SIGTERM's default, and Ctrl-C's (a background job's shell ignores it)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _train(out: Path) -> tuple[subprocess.Popen, Path, Path]:
    stdout, stderr = out / "train.out", out / "train.err"
    with stdout.open("w") as o, stderr.open("w") as e:
        process = subprocess.Popen(
            [sys.executable, "-m", "vla_rl.cli", "train", "embodied_srpo", f"run.output_dir={out / 'runs'}",
             "run.name=terminated", "warm_start.num_demos=2", "trainer.total_steps=1"],
            stdout=o, stderr=e, preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    return process, stdout, stderr


def _wait_for(condition, process: subprocess.Popen, stderr: Path, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert process.poll() is None, stderr.read_text()[-3000:]
        assert time.monotonic() < deadline, stderr.read_text()[-3000:]
        time.sleep(0.05)


@pytest.mark.e2e
@pytest.mark.parametrize("when", ["starting up", "Ray running"])
def test_a_terminated_run_stops_as_from_ctrl_c_and_leaves_no_empty_run_directory(when, tmp_path):
    """Terminated between writing its run directory and starting Ray, the run died at once and
    left the directory (no checkpoint to resume, and its run.name taken); once Ray ran, Ray's own
    handler exited with status 15 and no message."""
    process, stdout, stderr = _train(tmp_path)
    run = tmp_path / "runs" / "terminated"
    try:
        if when == "starting up":
            _wait_for(lambda: (run / "template.yaml").is_file(), process, stderr)
        else:
            _wait_for(lambda: "run directory" in stdout.read_text(), process, stderr)
        process.send_signal(signal.SIGTERM)
        try:
            status = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            logged = [line for line in stderr.read_text().splitlines() if "%|" not in line]  # no progress bars
            pytest.fail("still running 60 s after SIGTERM:\n" + "\n".join(logged[-80:]))
        assert status == 143, stderr.read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    # a worker's progress bar may reach the console after it (Ray prints its workers' output)
    lines = [line for line in stderr.read_text().splitlines() if line.strip() and "%|" not in line]
    assert lines[-1] == "error: terminated (SIGTERM)", lines[-5:]
    assert not run.exists()
