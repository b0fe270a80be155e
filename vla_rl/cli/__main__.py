"""``python -m vla_rl.cli``: the ``vla-rl`` command line."""

from vla_rl.cli import run

run()
