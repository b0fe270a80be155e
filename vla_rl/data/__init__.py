"""vla_rl.data"""
