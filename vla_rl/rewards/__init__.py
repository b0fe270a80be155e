"""vla_rl.rewards"""
