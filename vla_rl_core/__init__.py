"""The ground floor of vla-rl: the vocabulary ``policies/``, ``simulators/`` and ``vla_rl/`` share.

Batch keys (:mod:`~vla_rl_core.keys`), the observation schema (:mod:`~vla_rl_core.observations`),
the registry every plug-in family uses (:mod:`~vla_rl_core.registry`), the builder of components'
typed configs from a template's mappings (:mod:`~vla_rl_core.components`), the names of what a
run directory holds (:mod:`~vla_rl_core.run_layout`), openpi's wire format and the
websocket servers' token check (:mod:`~vla_rl_core.wire`, :mod:`~vla_rl_core.auth`), and the
procedural arithmetic problems (:mod:`~vla_rl_core.arithmetic`). It imports none of the three
packages above it; ``lint-imports`` (the contracts in pyproject.toml, run by
tests/test_import_floors.py) keeps it so.
"""
