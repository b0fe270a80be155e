"""The trainer's side of remote environments' connections: the **hub**, one websocket server per
run, as a Ray actor (:class:`RemoteHub`) whose server runs on an event loop of its own
(:class:`_HubServer`). The protocol and when an episode is lost: :mod:`simulators.remote_env`,
whose :class:`~simulators.remote_env.RemoteEnv` claims the hub's clients and steps them.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any

from simulators.remote_config import RemoteEnvConfig

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HANDSHAKE_TIMEOUT_S = 30.0
"""Seconds a connecting client has to send its hello."""
LOST = "lost"
"""Key of the hub's answer when the episode was lost (its value says why)."""


@dataclass
class _Client:
    """A connected remote environment."""

    id: int
    name: str
    websocket: Any
    lock: asyncio.Lock
    closed: bool = False


class RemoteHub:
    """The run's websocket server for remote environments (module docstring), as a Ray actor
    with blocking methods (Ray runs them on threads); the server runs on an event loop in a thread
    of its own (:class:`_HubServer`).

    Args:
        config: the run's remote environment config.
        token: the shared token clients must present (None: none).

    Raises:
        OSError: it cannot listen on ``config.host:config.port``.
    """

    def __init__(self, config: RemoteEnvConfig, token: str | None) -> None:
        self._server = _HubServer(config, token)
        self._loop = asyncio.new_event_loop()
        started, errors = threading.Event(), []

        def main() -> None:
            try:
                self._loop.run_until_complete(self._server.serve(started))
            except BaseException as err:  # reported to the constructor below
                errors.append(err)
                started.set()

        threading.Thread(target=main, name="vla-rl-remote-hub", daemon=True).start()
        started.wait()
        if errors:
            raise errors[0]

    def describe(self) -> tuple[int, RemoteEnvConfig]:
        """The port it listens on and the config it serves."""
        return self._server.port, self._server.config

    def claim(self, timeout_s: float) -> int | None:
        """A free client's id (now claimed), or None when none is free within ``timeout_s``."""
        return self._run(self._server.claim(timeout_s), timeout_s + 5.0)

    def request(self, client_id: int, message: dict, timeout_s: float,
                timeout_field: str = "simulator.env.step_timeout_s") -> dict:
        """Send ``message`` to the client and return its answer, or ``{"lost": why}`` when it
        disconnected, did not answer within ``timeout_s`` (the setting ``timeout_field``; it is
        then disconnected: its state is unknown), or answered with an error, a non-dict or garbage
        (not msgpack-numpy: it is then free again)."""
        return self._run(self._server.request(client_id, message, timeout_s, timeout_field), timeout_s + 5.0)

    def release(self, client_id: int) -> None:
        """Make a claimed client free again."""
        self._loop.call_soon_threadsafe(self._server.release, client_id)

    def stats(self) -> dict[str, int]:
        """Counts since the start: ``connected`` clients (hellos accepted), ``refused``
        connections (token, or an environment that does not fit), ``lost`` episodes (disconnects,
        timeouts, errors) and ``invalid`` ones (marked by the client); ``clients`` connected now."""
        return self._run(self._server.stats(), 5.0)

    def _run(self, coroutine, timeout_s: float) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)


class _HubServer:
    """The hub's websocket server and its clients, on one event loop (:class:`RemoteHub`)."""

    def __init__(self, config: RemoteEnvConfig, token: str | None) -> None:
        self.config, self.token = config, token
        self.port = config.port
        self._clients: dict[int, _Client] = {}
        self._ids = itertools.count()
        self._counts = {"connected": 0, "refused": 0, "lost": 0, "invalid": 0}
        self._idle: asyncio.Queue[_Client] | None = None
        self._closing: set[asyncio.Future] = set()  # connections being closed (held until done)

    async def serve(self, started: threading.Event) -> None:
        from websockets.asyncio.server import serve

        from vla_rl_core.auth import quiet_failed_handshakes

        quiet_failed_handshakes()  # a port probe: one line, not a traceback
        self._idle = asyncio.Queue()
        async with serve(self._handle, self.config.host, self.config.port, compression=None,
                         max_size=self.config.max_message_bytes, process_request=self._process_request) as server:
            self.port = server.sockets[0].getsockname()[1]
            logger.info("remote environments connect to ws://%s:%d (%s)", self.config.host, self.port,
                        "token required" if self.token else "no token")
            if self.config.host not in LOOPBACK:
                logger.warning("the remote environment hub is bound to %s, not loopback: other machines can connect%s",
                               self.config.host, "" if self.token else " and no token is required (set "
                               "VLA_RL_REMOTE_TOKEN)")
            started.set()
            await asyncio.Future()  # until the process ends

    async def stats(self) -> dict[str, int]:
        return {**self._counts, "clients": len(self._clients)}

    def _process_request(self, connection, request):
        from vla_rl_core.auth import REFUSAL, token_problem

        problem = token_problem(request, self.token)
        if problem is None:
            return None
        self._counts["refused"] += 1
        logger.warning("refused a remote environment from %s: %s", _address(connection), problem)
        return connection.respond(http.HTTPStatus.UNAUTHORIZED, REFUSAL)

    async def _handle(self, websocket) -> None:
        from websockets.exceptions import ConnectionClosed

        from vla_rl_core import wire

        address = _address(websocket)
        try:
            hello = wire.unpackb(await asyncio.wait_for(websocket.recv(), HANDSHAKE_TIMEOUT_S))
        except ConnectionClosed as closed:
            if _too_big(closed):
                self._counts["refused"] += 1
                logger.warning("refused a remote environment from %s: %s", address, self._too_big_why("hello"))
            else:  # it left before saying hello (a port probe, a client stopped): nothing to refuse
                logger.info("a connection from %s closed before its hello", address)
            return
        except Exception as err:  # noqa: BLE001 (a client that cannot say hello is refused, whatever it sent)
            hello, problem = None, f"no hello ({type(err).__name__}: {err})"
        else:
            problem = self.config.fit_problem(hello)
        if problem is not None:
            self._counts["refused"] += 1
            logger.warning("refused a remote environment from %s: %s", address, problem)
            try:
                await websocket.send(f"vla-rl remote: {problem}")
                await websocket.close(1008, "does not fit this run")
            except ConnectionClosed:
                pass  # it left meanwhile: refused all the same
            return
        client = _Client(next(self._ids), str(hello.get("name") or address), websocket, asyncio.Lock())
        await websocket.send(wire.packb({"type": "welcome", "task": self.config.task, "horizon": self.config.horizon}))
        self._clients[client.id] = client
        self._counts["connected"] += 1
        logger.info("remote environment %d (%s, %s) connected", client.id, client.name, address)
        self._idle.put_nowait(client)
        await websocket.wait_closed()
        client.closed = True
        self._clients.pop(client.id, None)
        logger.info("remote environment %d (%s) disconnected", client.id, client.name)

    async def claim(self, timeout_s: float) -> int | None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            try:
                client = await asyncio.wait_for(self._idle.get(), max(deadline - asyncio.get_running_loop().time(), 0))
            except TimeoutError:
                return None
            if not client.closed:
                return client.id

    def release(self, client_id: int) -> None:
        client = self._clients.get(client_id)
        if client is not None and not client.closed:
            self._idle.put_nowait(client)

    async def request(self, client_id: int, message: dict, timeout_s: float,
                      timeout_field: str = "simulator.env.step_timeout_s") -> dict:
        from websockets.exceptions import ConnectionClosed

        from vla_rl_core import wire

        client = self._clients.get(client_id)
        if client is None or client.closed:
            return self._lost(client_id, "it disconnected")
        async with client.lock:
            try:
                await client.websocket.send(wire.packb(message))
                answer = await asyncio.wait_for(client.websocket.recv(), timeout_s)
            except ConnectionClosed as closed:
                return self._lost(client_id, self._too_big_why("answer") if _too_big(closed) else "it disconnected")
            except TimeoutError:  # its state is unknown: closed, without waiting for a client that may
                client.closed = True  # not answer the close either (websockets' close waits up to 10 s)
                closing = asyncio.ensure_future(client.websocket.close(1011, "no answer in time"))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
                return self._lost(client_id, f"no answer within {timeout_field}={timeout_s:g} s")
        if isinstance(answer, str):
            self.release(client_id)  # still connected: free for another episode
            return self._lost(client_id, f"it reported an error: {answer}")
        try:
            answer = wire.unpackb(answer)
        except ValueError as err:  # garbage (not msgpack, a malformed array): this episode is lost, not the hub
            self.release(client_id)
            return self._lost(client_id, f"its answer is {err}")
        if not isinstance(answer, dict):
            self.release(client_id)
            return self._lost(client_id, f"it answered {type(answer).__name__}, not a dict")
        if answer.get("invalid"):
            self._counts["invalid"] += 1
        return answer

    def _too_big_why(self, message: str) -> str:
        return (f"its {message} is larger than the {self.config.max_message_bytes / 2**20:.1f} MiB this run's "
                f"messages may take (twice its state_dim {self.config.state_dim} floats and cameras "
                f"{list(self.config.cameras)} at camera_size {self.config.camera_size}, plus 1 MiB): the hub "
                "closed its connection")

    def _lost(self, client_id: int, why: str) -> dict:
        self._counts["lost"] += 1
        logger.warning("remote environment %d lost its episode: %s", client_id, why)
        return {LOST: f"remote environment {client_id}: {why}"}


def _too_big(closed: Exception) -> bool:
    """Whether the hub closed this connection because a message was over its size limit."""
    from websockets.frames import CloseCode

    sent = getattr(closed, "sent", None)
    return sent is not None and sent.code == CloseCode.MESSAGE_TOO_BIG


def _address(connection: Any) -> str:
    address = getattr(connection, "remote_address", None)
    return f"{address[0]}:{address[1]}" if address else "?"
