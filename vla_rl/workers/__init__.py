"""vla_rl.workers"""
