"""``python -m vla_rl.cli``: the ``vla-rl`` command line."""

import sys

from vla_rl.cli import main

sys.exit(main())
