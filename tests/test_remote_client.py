"""``vla_rl.remote.RobotClient`` (``vla-rl remote-env``) connects again whatever ended a connection
attempt, short of the hub refusing its token or environment."""

from __future__ import annotations

import socket
import threading

import gymnasium as gym
import numpy as np

from vla_rl.remote import RobotClient


class PointEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_a_peer_that_closes_during_the_handshake_is_tried_again():
    """A listener that accepts and closes before any HTTP reply (a hub restarting, a proxy):
    websockets raises InvalidMessage, which used to end the client's thread for good."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    attempts = []

    def accept_and_close():
        for _ in range(3):
            connection, _ = listener.accept()
            connection.recv(4096)
            attempts.append(1)
            connection.close()

    acceptor = threading.Thread(target=accept_and_close, daemon=True)
    acceptor.start()
    client = RobotClient(PointEnv(), f"ws://127.0.0.1:{listener.getsockname()[1]}", retry_s=0.05)
    stop = threading.Event()
    thread = client.start(stop)
    acceptor.join(timeout=20)
    try:
        assert len(attempts) == 3  # it came back after each closed handshake
        assert thread.is_alive() and client.error is None
    finally:
        stop.set()
        thread.join(timeout=20)
        listener.close()
    assert not thread.is_alive() and client.error is None
