"""Evaluation rollouts of checkpoints (``vla-rl eval``, ``dag_templates/eval_rollout.yaml``).

- :mod:`.protocol`: the action protocols (greedy, sampled at a temperature);
- :mod:`.benchmarks`: benchmarks as registered task lists;
- :mod:`.compatibility`: which tasks a policy can be evaluated on;
- :mod:`.targets`: the checkpoints a ``vla-rl eval`` command names;
- :mod:`.overrides`: which overrides ``vla-rl eval`` takes;
- :mod:`.episode_store`: every evaluation episode in zarr, one store per task and worker;
- :mod:`.session`: a DAG worker's evaluation state (finished episodes, counts), with
  :mod:`.embodied` (simulator pools, checkpoints) and :mod:`.text` (prompts) sessions;
- :mod:`.replay`, :mod:`.video`: re-running stored actions (re-scoring, videos);
- :mod:`.report`: success rates with Wilson intervals, Markdown / JSON report and plot.

The driver side of ``vla-rl eval`` is :mod:`vla_rl.eval_driver`.
"""
