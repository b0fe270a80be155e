"""Workflow kits: what differs between training a robot policy in simulators and a language model
on prompts, one object per workflow, chosen by the template's ``run.workflow``.

A :class:`~vla_rl.workflows.base.Workflow` builds the policy and the critic, says how a batch
is scored (the batch forward and the keys it reads), refills dynamic sampling, builds the
held-out evaluation and adds to checkpoints. The DAG worker and the shared nodes (advantages,
filters, reference, actor and critic updates) never branch on the workflow: a third one (multi-turn
text, another simulator family) is a new module registering a new kit, plus its own node
functions, without editing them. Kits register in
:data:`vla_rl.dag.registry.WORKFLOWS` (``WORKFLOWS.get(run.workflow)``).
"""
