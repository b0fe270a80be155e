"""``vla-rl serve``: a websocket policy server speaking openpi's protocol, batching concurrent clients.

The protocol is openpi's (``openpi.serving.websocket_policy_server`` and the PyPI package
``openpi-client``'s ``WebsocketClientPolicy``), so robot runtimes written for openpi drive a vla-rl
policy unchanged:

1. the client opens a websocket (``ws://HOST:PORT``; with a token, the header
   ``Authorization: Api-Key TOKEN``, which ``WebsocketClientPolicy(api_key=TOKEN)`` sends);
2. the server sends its metadata, one msgpack-numpy message (:meth:`ServedPolicy.metadata`:
   ``action_horizon``, ``action_dim``, the inputs it takes);
3. each binary message from the client is an observation dict (:mod:`vla_rl_core.wire`); the
   server answers ``{"actions": float32 (action_horizon, action_dim), "policy_timing":
   {"infer_ms"}, "server_timing": {"infer_ms", "batch_size", "prev_total_ms", "total_ms"}}``: one
   action chunk in the robot's units (``openpi_client.action_chunk_broker.ActionChunkBroker``
   hands it out one action at a time). A request may add ``"sample": true`` to sample from the
   policy instead of taking its mode (the server's default, ``--sample``, otherwise).

Timing fields, milliseconds (openpi's reply carries ``policy_timing.infer_ms`` and
``server_timing.infer_ms`` / ``prev_total_ms``; ``batch_size`` and ``total_ms`` are vla-rl's):
``policy_timing.infer_ms``, the forward of the request's batch on the policy thread;
``server_timing.infer_ms``, that forward as the event loop waited for it (the hand-off to the
thread included); ``batch_size``, requests in that forward; ``total_ms``, from receiving the
request to packing the reply (queueing included, the send not); ``prev_total_ms``, from the second
reply with actions of a connection on, the previous such reply's total including its send.

A request that cannot be served is answered with a text message, one line that says what to send
(not msgpack or a malformed array in it, a missing key, a wrong shape or dtype, a state value not
finite in float32: :class:`~vla_rl.serving.inputs.ObservationError`) or what failed (the
policy's forward; actions that are not finite, which are never sent; any other error while serving
it); ``WebsocketClientPolicy.infer`` raises it as ``RuntimeError``. Unlike openpi's server, which
closes the connection after an error, the connection stays open and the server keeps serving
every client. ``GET /healthz`` answers 200 (openpi's health check).

Batching: the requests of all connections go to one queue; the policy runs one forward per
batch, on one thread, while the event loop goes on receiving. A batch is what is queued when the
previous forward ends, plus what arrives within ``batch_window_ms`` of its first request, up to
``max_batch`` (greedy and sampled requests in separate forwards). With one client a window only
adds latency (default 0: no waiting; concurrent clients still share forwards whenever the policy
is busy).

The server binds 127.0.0.1 unless told otherwise; binding another address is logged as a warning
(anyone who reaches the port can drive the robot: give ``--token``). A message larger than
``max_message_mb`` (default :data:`vla_rl.serving.DEFAULT_MAX_MESSAGE_MB`)
closes its connection (websocket close code 1009, "message too big"), logged as a warning
naming the limit, before it is held in memory; openpi's server sets no limit, so any client that
reaches the port could make it allocate any amount.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http
import logging
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import websockets
from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.frames import CloseCode

from vla_rl.serving import DEFAULT_MAX_MESSAGE_MB, ServeError
from vla_rl.serving.policy import ServedPolicy
from vla_rl_core import wire
from vla_rl_core.auth import REFUSAL, quiet_failed_handshakes, token_problem

logger = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
HEALTH_PATH = "/healthz"
SAMPLE_KEY = "sample"
"""Optional request key: ``True`` samples this request's actions, ``False`` takes the mode."""
STATS_INTERVAL_S = 30.0


@dataclass
class _Pending:
    obs: Any
    sample: bool
    future: asyncio.Future


def check_settings(host: str, port: int, token: str | None, batch_window_ms: float, max_batch: int,
                   probe_port: bool = False, max_message_mb: float = DEFAULT_MAX_MESSAGE_MB) -> None:
    """The server's settings, checked before a policy is loaded (``vla-rl serve`` runs this
    first: loading a large policy takes minutes).

    Args:
        probe_port: also bind ``host:port`` once and let it go (a port in use, an address this
            machine does not have), as the server will.

    Raises:
        ServeError: naming the option: an empty ``--host`` (it would bind every interface, on
            two ports), a port outside [0, 65535] or one that cannot be bound, a negative batch
            window, ``--max-batch`` < 1, an empty ``--token``, ``--max-message-mb`` not > 0.
    """
    import socket

    if not host:
        raise ServeError("--host must name an address (127.0.0.1, the default: loopback only; 0.0.0.0: every IPv4 "
                         "interface)")
    if not 0 <= port <= 65535:
        raise ServeError(f"--port must be in [0, 65535], got {port}")
    if not batch_window_ms >= 0:
        raise ServeError(f"--batch-window-ms must be >= 0, got {batch_window_ms}")
    if max_batch < 1:
        raise ServeError(f"--max-batch must be >= 1, got {max_batch}")
    if token is not None and not token:
        raise ServeError("--token (or VLA_RL_SERVE_TOKEN) must not be empty: set a token, or leave both unset")
    if not (math.isfinite(max_message_mb) and max_message_mb > 0):
        raise ServeError(f"--max-message-mb must be a finite number > 0 (MiB), got {max_message_mb}")
    if probe_port:
        try:
            family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's listener
                probe.bind(address)
        except OSError as err:
            raise ServeError(f"--host {host} --port {port} cannot be bound: {err.strerror or err}") from None


class PolicyServer:
    """Serve ``served`` to websocket clients (module docstring).

    Args:
        served: the policy.
        host: address to bind (127.0.0.1 by default; another address is logged as a warning).
        port: TCP port; 0 picks a free one (:attr:`port` tells which, once started).
        token: the shared secret a client must present (``Authorization: Api-Key TOKEN``); None:
            no authentication.
        sample: sample actions for requests that do not say (default: the mode).
        batch_window_ms: how long a batch waits for more requests after its first, ms (>= 0).
        max_batch: most requests in one forward (>= 1).
        max_message_mb: the largest request, MiB (> 0); a larger one closes its connection.

    Raises:
        ServeError: a bad setting, or ``sample`` for a policy without an action distribution.
    """

    def __init__(self, served: ServedPolicy, host: str = "127.0.0.1", port: int = 8000, token: str | None = None,
                 sample: bool = False, batch_window_ms: float = 0.0, max_batch: int = 64,
                 max_message_mb: float = DEFAULT_MAX_MESSAGE_MB) -> None:
        check_settings(host, port, token, batch_window_ms, max_batch, max_message_mb=max_message_mb)
        if sample and not served.can_sample:
            raise ServeError(f"--sample: the {served.name} policy has no action distribution; it acts greedily only")
        self.served = served
        self.host, self.port = host, port
        self.token = token
        self.sample = sample
        self.batch_window_s = batch_window_ms / 1000.0
        self.max_batch = max_batch
        self.max_message_mb = max_message_mb
        self._queue: asyncio.Queue[_Pending] | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None  # made by each run()
        self._stats = {"requests": 0, "batches": 0, "errors": 0, "refused": 0}
        self._metadata = wire.packb(served.metadata())

    @property
    def stats(self) -> dict[str, int]:
        """Counts since the start: ``requests`` served, ``batches`` (forwards), ``errors`` (requests
        answered with an error), ``refused`` (connections without the token)."""
        return dict(self._stats)

    async def run(self, started: threading.Event | None = None, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (forever without one); ``started`` is set once listening.

        A server may run again after a run ended (each run has its own queue and policy thread).

        Raises:
            ServeError: it cannot listen on ``host:port``.
        """
        quiet_failed_handshakes()  # a TCP health check: one line, not a traceback
        self._queue = asyncio.Queue()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="vla-rl-policy")
        batcher = asyncio.create_task(self._batches())
        stats = asyncio.create_task(self._log_stats())
        try:
            try:
                server = await serve(self._handle, self.host, self.port, compression=None,
                                     max_size=int(self.max_message_mb * 2**20), process_request=self._process_request)
            except OSError as err:
                raise ServeError(f"cannot listen on {self.host}:{self.port}: {err.strerror or err}") from err
            async with server:
                self.port = server.sockets[0].getsockname()[1]
                self._log_start()
                if started is not None:
                    started.set()
                await (stop.wait() if stop is not None else asyncio.Future())
        finally:
            batcher.cancel()
            stats.cancel()
            self._executor.shutdown(wait=False, cancel_futures=True)

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted (Ctrl-C)."""
        asyncio.run(self.run())

    # ------------------------------------------------------------------ connections
    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == HEALTH_PATH:
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        problem = token_problem(request, self.token)
        if problem is not None:
            self._stats["refused"] += 1
            logger.warning("refused a connection from %s: %s", _address(connection), problem)
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, REFUSAL)
        return None

    async def _handle(self, websocket: ServerConnection) -> None:
        address = _address(websocket)
        logger.info("client %s connected", address)
        prev_total_s = None  # the previous reply with actions on this connection, its send included
        try:
            await websocket.send(self._metadata)
            async for message in websocket:
                start = time.perf_counter()
                try:
                    reply = await self._reply(message, start, prev_total_s, address)
                except Exception as err:  # noqa: BLE001 (a bug fails this request, not the connection)
                    logger.exception("client %s: could not serve a request", address)
                    reply = f"vla-rl serve: could not serve this request: {type(err).__name__}: {_one_line(err)}"
                if isinstance(reply, str):
                    self._stats["errors"] += 1
                await websocket.send(reply)
                if isinstance(reply, bytes):
                    prev_total_s = time.perf_counter() - start
        except websockets.ConnectionClosed as closed:
            if closed.sent is not None and closed.sent.code == CloseCode.MESSAGE_TOO_BIG:
                logger.warning("client %s sent a message larger than --max-message-mb %g MiB: closed its connection",
                               address, self.max_message_mb)
        logger.info("client %s disconnected", address)

    async def _reply(self, message: str | bytes, start: float, prev_total_s: float | None,
                     address: str) -> bytes | str:
        """The reply to one request received at ``start``: the packed actions and timings (module
        docstring), or one text line (``vla-rl serve: ...``) when the request cannot be served (what
        to send instead), the policy failed on its batch, or the actions are not finite."""
        try:
            obs, sample = self._request(message)
        except ValueError as err:  # ObservationError included
            logger.warning("client %s: refused a request: %s", address, err)
            return f"vla-rl serve: {err}"
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Pending(obs, sample, future))
        try:
            actions, batch_size, infer_s, policy_s = await future
        except Exception as err:  # the forward failed: tell this client, keep serving
            logger.exception("client %s: the policy failed on a batch", address)
            return f"vla-rl serve: the policy failed on this request's batch: {type(err).__name__}: {_one_line(err)}"
        if not np.isfinite(actions).all():
            logger.warning("client %s: the policy's actions hold non-finite values; sent an error instead", address)
            return ("vla-rl serve: the policy's actions for this request hold non-finite values (inf or NaN); none "
                    "were sent (check the observation's values and scale)")
        server_timing = {"infer_ms": infer_s * 1000.0, "batch_size": batch_size}
        if prev_total_s is not None:
            server_timing["prev_total_ms"] = prev_total_s * 1000.0
        server_timing["total_ms"] = (time.perf_counter() - start) * 1000.0
        return wire.packb({"actions": actions, "policy_timing": {"infer_ms": policy_s * 1000.0},
                           "server_timing": server_timing})

    def _request(self, message: str | bytes) -> tuple[Any, bool]:
        if isinstance(message, str):
            raise ValueError("requests are binary msgpack-numpy messages (openpi_client.msgpack_numpy), not text")
        request = wire.unpackb(message)
        sample = request.get(SAMPLE_KEY, self.sample) if isinstance(request, dict) else self.sample
        if not isinstance(sample, (bool, np.bool_)):
            raise ValueError(f"{SAMPLE_KEY!r} must be true or false, got {wire.describe(sample)}")
        if sample and not self.served.can_sample:
            raise ValueError(f"{SAMPLE_KEY!r}: the {self.served.name} policy has no action distribution; it acts "
                             "greedily only")
        return self.served.inputs.engine_observation(request), bool(sample)

    # ------------------------------------------------------------------ batching
    async def _batches(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            deadline = loop.time() + self.batch_window_s
            while len(batch) < self.max_batch:
                if not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                    continue
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                except TimeoutError:
                    break
            for sample in (False, True):
                group = [item for item in batch if item.sample == sample]
                if group:
                    await self._forward(loop, group, sample)

    async def _forward(self, loop: asyncio.AbstractEventLoop, group: list[_Pending], sample: bool) -> None:
        start = time.perf_counter()
        try:
            actions, policy_s = await loop.run_in_executor(self._executor, self._act, [item.obs for item in group],
                                                           sample)
        except Exception as err:  # every request of the batch gets the error
            for item in group:
                if not item.future.done():
                    item.future.set_exception(err)
            return
        infer_s = time.perf_counter() - start
        self._stats["requests"] += len(group)
        self._stats["batches"] += 1
        for item, chunk in zip(group, actions, strict=True):
            if not item.future.done():  # the client may have gone
                item.future.set_result((chunk, len(group), infer_s, policy_s))

    def _act(self, observations: list[Any], sample: bool) -> tuple[np.ndarray, float]:
        """:meth:`ServedPolicy.act` on the policy thread, and its seconds (``policy_timing``)."""
        start = time.perf_counter()
        actions = self.served.act(observations, sample)
        return actions, time.perf_counter() - start

    # ------------------------------------------------------------------ logs
    def _log_start(self) -> None:
        logger.info("serving %s on ws://%s:%d (%s by default; %s; batches of up to %d, window %.1f ms)",
                    self.served.name, self.host, self.port, "sampled" if self.sample else "greedy",
                    "token required" if self.token else "no token", self.max_batch, self.batch_window_s * 1000)
        if self.host not in LOOPBACK:
            logger.warning("bound to %s, not loopback: other machines can reach this policy server%s", self.host,
                           "" if self.token else " and no token is required (add --token)")

    async def _log_stats(self) -> None:
        last = dict(self._stats)
        while True:
            await asyncio.sleep(STATS_INTERVAL_S)
            now = dict(self._stats)
            requests, batches = now["requests"] - last["requests"], now["batches"] - last["batches"]
            if requests or now["errors"] != last["errors"] or now["refused"] != last["refused"]:
                logger.info("last %.0f s: %d requests (%.1f/s) in %d forwards (mean batch %.1f), %d refused "
                            "requests, %d refused connections", STATS_INTERVAL_S, requests,
                            requests / STATS_INTERVAL_S, batches, requests / max(batches, 1),
                            now["errors"] - last["errors"], now["refused"] - last["refused"])
            last = now


@contextmanager
def server_thread(server: PolicyServer, timeout_s: float = 30.0) -> Iterator[PolicyServer]:
    """Run ``server`` on an event loop in a background thread (tests, benchmarks, notebooks);
    yields it once it listens (``server.port`` set) and stops it on exit.

    Raises:
        RuntimeError: it did not start within ``timeout_s`` (e.g. the port is taken).
    """
    started, errors = threading.Event(), []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def main() -> None:
        try:
            loop.run_until_complete(server.run(started, stop))
        except BaseException as err:  # reported to the caller below
            errors.append(err)
            started.set()
        finally:
            loop.close()

    thread = threading.Thread(target=main, name="vla-rl-serve", daemon=True)
    thread.start()
    if not started.wait(timeout_s) or errors:
        raise RuntimeError(f"the policy server did not start: {errors[0] if errors else 'timed out'}")
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout_s)


def _one_line(err: BaseException) -> str:
    """``err``'s message on one line (the reply to the client is one line)."""
    return " ".join(str(err).split())


def _address(connection: ServerConnection) -> str:
    address = connection.remote_address
    return f"{address[0]}:{address[1]}" if address else "?"
