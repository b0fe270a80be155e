"""What vla-rl's websocket servers (``vla-rl serve``, the remote environment hub) share: the
shared-token check (the client sends the header ``Authorization: Api-Key TOKEN``, as
openpi-client's ``WebsocketClientPolicy(api_key=TOKEN)`` does), and a failed opening handshake
logged in one line (:func:`quiet_failed_handshakes`)."""

from __future__ import annotations

import hmac
import logging
from typing import Any

AUTHORIZATION = "Authorization"
REMOTE_TOKEN_ENV = "VLA_RL_REMOTE_TOKEN"
"""The environment variable holding a run's remote-environment token (``simulator.name: remote``):
read in the driver, which hands it to its DAG workers (a Ray started earlier in the same process
would otherwise give them the environment of that time)."""
REFUSAL = "missing or wrong token (send the header Authorization: Api-Key TOKEN)\n"
"""The body of the 401 answer."""


def api_key_headers(token: str | None) -> dict[str, str] | None:
    """The headers a client sends with ``token`` (None: none)."""
    return {AUTHORIZATION: f"Api-Key {token}"} if token else None


def token_problem(request: Any, token: str | None) -> str | None:
    """Why a websocket handshake ``request`` (``websockets``' Request) lacks ``token`` (``"no
    token"``, ``"wrong token"``), or None when it has it or no token is required; compared in
    constant time."""
    if token is None:
        return None
    sent = request.headers.get(AUTHORIZATION, "")
    # websockets decodes header bytes that are not UTF-8 as surrogates: encode them back as they
    # came (a strict encode raised, and the server answered 500 instead of 401)
    if hmac.compare_digest(sent.encode("utf-8", "surrogateescape"), f"Api-Key {token}".encode()):
        return None
    return "wrong token" if sent else "no token"


class _OneLineHandshakeFailure(logging.Filter):
    """``websockets``' "opening handshake failed" (an ERROR with a 30-line chained traceback, for
    every TCP health check or port probe that closes without an HTTP request) as one INFO line
    naming the reason; its "connection rejected (200 OK)" for an answered health check
    (``GET /healthz``) as what it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "connection rejected (%d %s)" and record.args and record.args[0] == 200:
            record.msg, record.args = "answered an HTTP request (200 OK): a health check", None
        if record.getMessage() == "opening handshake failed" and record.exc_info and _peer_left(record.exc_info[1]):
            error = record.exc_info[1]
            cause = error.__cause__ or error.__context__
            reason = f"{type(error).__name__}: {error}" + (f" ({cause})" if cause is not None else "")
            record.msg, record.args, record.exc_info, record.exc_text = (
                f"opening handshake failed: {reason}".replace("\n", " "), None, None, None)
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _peer_left(error: BaseException) -> bool:
    """Whether a failed handshake is the peer's doing (it closed, reset, sent no HTTP request or
    one that is no websocket handshake, e.g. a plain HTTP health check: websockets'
    ``InvalidHandshake`` family, EOF, a connection error), not an error of the server's own
    request handler, which keeps its ERROR and traceback."""
    from websockets.exceptions import InvalidHandshake

    return isinstance(error, (InvalidHandshake, EOFError, ConnectionError))


_HANDSHAKE_FILTER = _OneLineHandshakeFailure()


def quiet_failed_handshakes() -> None:
    """Log ``websockets``' failed opening handshakes (a TCP probe, a half-open socket, a client
    that is not a websocket) in one INFO line instead of an ERROR with a traceback; idempotent."""
    server_logger = logging.getLogger("websockets.server")
    if _HANDSHAKE_FILTER not in server_logger.filters:
        server_logger.addFilter(_HANDSHAKE_FILTER)
