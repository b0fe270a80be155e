"""vla_rl.trainers"""
