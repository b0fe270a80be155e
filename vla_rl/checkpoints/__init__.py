"""Training checkpoints: the layout on disk (:mod:`~vla_rl.checkpoints.layout`), the FSDP actor's
sharded state (:mod:`~vla_rl.checkpoints.sharded`), manifests, verification and fallback
(:mod:`~vla_rl.checkpoints.integrity`), and saving, publishing and loading
(:mod:`~vla_rl.checkpoints.files`). Each module imports only those listed before it."""
