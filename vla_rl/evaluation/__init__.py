"""Evaluation rollouts of checkpoints (``vla-rl eval``, ``dag_templates/eval_rollout.yaml``).

- :mod:`.protocol`: the action protocols (greedy, sampled at a temperature);
- :mod:`.benchmarks`: benchmarks as registered task lists;
- :mod:`.episode_store`: every evaluation episode in zarr, one store per task and worker;
- :mod:`.session`: a DAG worker's evaluation state (its pools, checkpoints, finished episodes);
- :mod:`.replay`: re-running stored actions (re-scoring, videos);
- :mod:`.report`: success rates with Wilson intervals, Markdown / JSON report and plot;
- :mod:`.runner`: the driver side of ``vla-rl eval``.
"""
