"""The remote environment hub (simulators/remote_hub.py ``_HubServer``, on its own event loop, no
Ray): whatever a client answers, a request returns an answer or a lost episode, and a client still
connected after a bad answer is free for another episode."""

from __future__ import annotations

import asyncio
import re
import threading
import time

import msgpack
import pytest

pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")
from websockets.sync.client import connect

from simulators.remote_config import RemoteEnvConfig
from simulators.remote_hub import LOST, _HubServer
from vla_rl_core import wire

RESET = {"type": "reset", "init_state_id": 0, "task": "remote"}


@pytest.fixture()
def hub():
    """A hub on loopback (state_dim 3, action_dim 2) and a function running its coroutines."""
    server = _HubServer(RemoteEnvConfig(state_dim=3, action_dim=2, port=0), None)
    loop, started, closing = asyncio.new_event_loop(), threading.Event(), threading.Event()

    async def run_hub():
        serving = asyncio.ensure_future(server.serve(started))
        while not closing.is_set():
            await asyncio.sleep(0.02)
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)

    runner = threading.Thread(target=loop.run_until_complete, args=(run_hub(),), daemon=True)
    runner.start()
    assert started.wait(20)
    yield server, lambda coroutine: asyncio.run_coroutine_threadsafe(coroutine, loop).result(20)
    closing.set()
    runner.join(10)
    loop.close()


def client(port: int, answer: bytes | str, leave: threading.Event) -> threading.Thread:
    """A remote environment that says hello, then answers every request with ``answer`` until ``leave``."""

    def main() -> None:
        with connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None) as ws:
            ws.send(wire.packb({"type": "hello", "name": "garbage", "state_dim": 3, "action_dim": 2, "images": {}}))
            ws.recv()
            while not leave.is_set():
                try:
                    ws.recv(timeout=0.1)
                except TimeoutError:
                    continue
                ws.send(answer)

    thread = threading.Thread(target=main, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("answer, why", [
    ("boom", "it reported an error: boom"),
    (wire.packb([1, 2]), "it answered list, not a dict"),
    (b"\xc1", "its answer is not a msgpack-numpy message"),
    (msgpack.packb({"obs": {b"__ndarray__": True, b"data": b"", b"dtype": "<f4"}}),
     "its answer is not a msgpack-numpy message.*'shape'"),
], ids=["text", "not-a-dict", "not-msgpack", "array-without-shape"])
def test_a_bad_answer_loses_the_episode_and_frees_the_client(hub, answer, why):
    """Garbage (not msgpack, a malformed array map) raised out of request() and kept the client
    claimed for good; text and non-dict answers were already a lost episode."""
    server, run = hub
    leave = threading.Event()
    thread = client(server.port, answer, leave)
    try:
        claimed = run(server.claim(10))
        assert claimed is not None
        lost = run(server.request(claimed, RESET, 5))
        assert set(lost) == {LOST}
        assert lost[LOST].startswith(f"remote environment {claimed}: ")
        assert re.search(why, lost[LOST])
        assert run(server.claim(5)) == claimed  # free again
        assert run(server.stats())["lost"] == 1
    finally:
        leave.set()
        thread.join(10)


def frozen_client(port: int):
    """A remote environment that says hello, reads the welcome, then never reads again (a process
    stopped with SIGSTOP, a network partition): it answers no request and no close frame. Spoken
    with websockets' sans-I/O protocol over a plain socket, so that no thread answers for it."""
    import socket

    from websockets.client import ClientProtocol
    from websockets.protocol import State
    from websockets.uri import parse_uri

    protocol = ClientProtocol(parse_uri(f"ws://127.0.0.1:{port}"), max_size=None)
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    protocol.send_request(protocol.connect())

    def exchange(until) -> None:
        for data in protocol.data_to_send():
            sock.sendall(data)
        while not until():
            protocol.receive_data(sock.recv(65536))
            for data in protocol.data_to_send():
                sock.sendall(data)

    exchange(lambda: protocol.state is State.OPEN)
    protocol.send_binary(wire.packb({"type": "hello", "name": "frozen", "state_dim": 3, "action_dim": 2,
                                     "images": {}}))
    exchange(lambda: bool(protocol.events_received()))  # the welcome
    return sock


def test_a_frozen_client_loses_its_episode_in_its_timeout(hub):
    """The hub closed a client that did not answer in time by waiting for its closing handshake
    (websockets' close_timeout, 10 s) while the run gave up at the timeout + 5 s: a frozen client
    (SIGSTOP) stopped the training run with a TimeoutError traceback instead of losing its episode."""
    server, run = hub
    sock = frozen_client(server.port)
    try:
        claimed = run(server.claim(10))
        assert claimed is not None
        started = time.monotonic()
        lost = run(server.request(claimed, RESET, 0.5))
        assert lost == {LOST: f"remote environment {claimed}: no answer within simulator.env.step_timeout_s=0.5 s"}
        assert time.monotonic() - started < 5  # was 10.5 s, past RemoteHub.request's 5.5 s
        assert run(server.request(claimed, RESET, 0.5))[LOST].endswith("it disconnected")  # not claimed again
        assert run(server.claim(0.5)) is None
    finally:
        sock.close()


def test_a_message_larger_than_the_run_needs_loses_the_episode_before_the_hub_holds_it(hub, caplog):
    """The hub took messages of any size (``max_size=None``): a client sending 300 MB had the hub
    hold it. Now the limit is twice what the run's observation takes plus 1 MiB (here about
    1 MiB), the hub closes the connection (code 1009), the episode is lost saying why, and the
    client, told so, logs a warning."""
    import logging

    import gymnasium as gym
    import numpy as np

    from vla_rl.remote import RobotClient

    class Oversized(gym.Env):
        """Declares a state of 3 values, observes 1 M of them."""
        observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
        action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

        def reset(self, *, seed=None, options=None):
            return np.zeros(2**20, np.float32), {}

    server, run = hub
    assert server.config.max_message_bytes == 2 * 3 * 4 + 2**20
    stop = threading.Event()
    robot = RobotClient(Oversized(), f"ws://127.0.0.1:{server.port}", retry_s=30)
    with caplog.at_level(logging.WARNING):
        robot.start(stop)
        try:
            claimed = run(server.claim(10))
            assert claimed is not None
            lost = run(server.request(claimed, RESET, 10))
            assert re.search(r"its answer is larger than the 1\.0 MiB this run's messages may take .*closed its "
                             r"connection", lost[LOST])
            assert run(server.stats())["lost"] == 1
            deadline = time.monotonic() + 10
            while "larger than the hub takes" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
            assert "larger than the hub takes" in caplog.text
        finally:
            stop.set()
            robot.thread.join(10)


@pytest.mark.parametrize("images, shown", [([1, 2], "images a list"), ({"a_image": 5}, "images a dict"),
                                            ({"a_image": [8, 8, 3]}, "images {'a_image': [8, 8, 3]}")])
def test_a_hello_with_malformed_images_is_refused_in_one_line(hub, images, shown, caplog):
    """``images`` as a list, or a camera's shape as a number, made the hub's connection handler
    fail (a websockets traceback in the log, close code 1011 without a word, not counted refused)."""
    import logging

    server, run = hub
    with caplog.at_level(logging.WARNING), connect(f"ws://127.0.0.1:{server.port}", max_size=None) as ws:
        ws.send(wire.packb({"type": "hello", "state_dim": 3, "action_dim": 2, "images": images}))
        assert ws.recv(timeout=10) == f"vla-rl remote: the environment does not fit this run: {shown} (this run: {{}})"
    assert run(server.stats())["refused"] == 1 and "Traceback" not in caplog.text


def test_a_hello_larger_than_the_run_needs_is_refused(hub, caplog):
    import logging

    server, _ = hub
    with caplog.at_level(logging.WARNING), connect(f"ws://127.0.0.1:{server.port}", max_size=None) as ws:
        ws.send(wire.packb({"type": "hello", "name": "x" * 2**21}))
        with pytest.raises(Exception, match="1009"):
            ws.recv(timeout=10)
    deadline = time.monotonic() + 10
    while "its hello is larger than" not in caplog.text and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "refused a remote environment" in caplog.text and "its hello is larger than" in caplog.text
