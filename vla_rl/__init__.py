"""vla-rl: reinforcement-learning post-training of VLA policies and language models on one
multi-controller DAG engine."""

__version__ = "0.1.0"
