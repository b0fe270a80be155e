"""vla_rl.rollout"""
