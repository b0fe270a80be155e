"""Serving trained policies to robots: ``vla-rl serve`` (:mod:`vla_rl.serving.server`) speaks
openpi's websocket protocol (:mod:`vla_rl_core.wire`), maps the clients' observation layouts
onto the policy's inputs (:mod:`vla_rl.serving.inputs`) and acts as the rollouts act
(:mod:`vla_rl.serving.policy`)."""


#: The default largest request of ``vla-rl serve``, MiB (``--max-message-mb``; a few camera images
#: take a few MiB).
DEFAULT_MAX_MESSAGE_MB = 64.0


class ServeError(ValueError):
    """What ``vla-rl serve`` was given cannot be served (reported in one line, exit 2)."""
