"""The shared-token check of vla-rl's websocket servers (``vla-rl serve``, the remote environment
hub): the client sends the header ``Authorization: Api-Key TOKEN``, as openpi-client's
``WebsocketClientPolicy(api_key=TOKEN)`` does."""

from __future__ import annotations

import hmac
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
