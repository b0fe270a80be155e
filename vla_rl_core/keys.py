"""Declared batch keys. Batches are ``tensordict.TensorDict`` objects with the batch dimension
first; embodied batches hold one row per episode. Code refers to these constants, never to
scattered string literals.
"""

# Identity of a sample and its group.
UID = "uid"  # (batch,) int64: the group (all rollouts of one initial state share it)
INIT_STATE_ID = "init_state_id"  # (batch,) int64: the id that seeds the environment reset
TASK_ID = "task_id"  # (batch,) int64: the task (one per benchmark task)

# Text prompts and responses (text workflow; a response token is a one-dimension action).
INPUT_IDS = "input_ids"  # (batch, prompt_len) int64: the chat-templated prompt, left-padded
ATTENTION_MASK = "attention_mask"  # (batch, prompt_len) int64 0/1: 0 on the left padding
RESPONSES = "responses"  # (batch, response_len) int64: sampled tokens, right-padded (mask: response_mask)

# Rollout.
OBS = "obs"  # (batch, horizon + 1, obs_dim) float32: obs[t] is seen before action t; obs[finish_step] is terminal
# With camera observations, OBS is a TensorDict of batch size (batch, horizon + 1) holding:
OBS_STATE = "state"  # (batch, horizon + 1, obs_dim) float32: the simulator's state vector
OBS_IMAGE_SUFFIX = "_image"  # "<camera>_image": (batch, horizon + 1, H, W, 3) uint8 RGB, e.g. "agentview_image"
# "<camera>_model_image": (..., S, S, 3) uint8 RGB, the frame as the policy's model reads it (resized,
# padded or cropped to its vision input): made on a worker by policy.model_ready_observations for the
# passes that follow (the update's epochs, behaviour cloning's steps), never sent between workers.
OBS_MODEL_IMAGE_SUFFIX = "_model_image"
OBS_INSTRUCTION = "instruction"  # (batch, horizon + 1, INSTRUCTION_BYTES) uint8: the task's instruction, UTF-8, 0-padded
# With a task set (simulator.tasks), OBS is a TensorDict (flat states too) that also holds:
OBS_TASK_ID = "task_id"  # (batch, horizon + 1) int64: the episode's task, its position in simulator.tasks
ACTIONS = "actions"  # (batch, horizon, chunk, own_action_dim) float32: the policy's own sampled (unclipped) actions
# (own_action_dim = policy.own_action_dim: action_dim for most policies, π0's whole denoising chain)
OLD_LOG_PROBS = "old_log_probs"  # (batch, horizon, chunk) float32: log-probs under the rollout policy
RESPONSE_MASK = "response_mask"  # (batch, horizon) bool: True for steps the policy acted in
SUCCESS = "success"  # (batch,) bool
FINISH_STEP = "finish_step"  # (batch,) int64: decision steps taken (action chunks; the episode length)
CONTROL_STEPS = "control_steps"  # (batch,) int64: actions executed (control steps); an episode that ends inside a
# chunk (a success, the time limit) never executes the rest of it, and those actions are no unit of the loss
TRUNCATED = "truncated"  # (batch,) bool: the episode hit its time limit without success; a text response reached
# text.max_response_length without an end-of-sequence token

# Evaluation episodes (vla-rl eval).
CHECKPOINT_INDEX = "checkpoint_index"  # (batch,) int64: position in eval.checkpoints
PROTOCOL_INDEX = "protocol_index"  # (batch,) int64: position in the evaluation's protocols
ENV_ACTIONS = "env_actions"  # (batch, horizon, chunk, action_dim) float32: what the simulator received

# Models other than the rollout policy.
REF_LOG_PROBS = "ref_log_probs"  # (batch, horizon, chunk, own_action_dim) float32: per element, under the reference
VALUES = "values"  # (batch, horizon) float32: critic values V(obs[t]) at collection time

# Rewards and advantages.
REWARDS = "rewards"  # (batch,) float32: outcome (or SRPO progress) reward of each episode
TOKEN_LEVEL_REWARDS = "token_level_rewards"  # (batch, horizon) float32: outcome on the last step, minus KL penalties
ADVANTAGES = "advantages"  # (batch, horizon) float32: per decision step, 0 after the episode's end
RETURNS = "returns"  # (batch, horizon) float32: the critic's regression targets
