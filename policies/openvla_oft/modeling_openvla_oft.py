"""OpenVLA-OFT policy (Kim et al. 2025, arXiv:2502.19645): a whole action chunk decoded in one
parallel forward pass.

The sequence is ``[BOS, patches (image after image), proprio token?, prompt,
chunk_size × action_dim empty placeholders, stop token]``, as ``predict_action`` of
moojink/openvla-oft's ``prismatic/extern/hf/modeling_prismatic.py`` builds it: placeholder
embeddings are zero (OFT multiplies action-token embeddings by ``~all_actions_mask``), and the
hidden states / logits for the actions are read at positions ``L - 1 .. L + n - 2`` (``L`` the
prefix length, OFT's ``NUM_PATCHES + NUM_PROMPT_TOKENS``: the last prompt token predicts the
first action value). Attention is fully bidirectional over every non-padding position, prefix
included (the prefix sees the placeholders and the stop token too), as OpenVLA-OFT trains and
runs: its pinned transformers fork (moojink/transformers-openvla-oft, commit bc339d9, "Full
bidirectional attention") replaces Llama's causal SDPA mask with its last row (the padding mask)
for every query and sets ``is_causal=False``.

Since the input never depends on the action values, the distributions that sampling uses and
those that scoring given actions uses come from one and the same pass: the log-probs of
:meth:`OpenVLAOFTPolicy.sample_actions` equal :meth:`log_prob_and_entropy_per_dim` bit for
bit for the same batch (not across batch shapes: see docs/vla_policies.md).
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path

import torch
from tensordict import TensorDict
from torch import Tensor
from torch.nn import functional as F

from policies import register_policy
from policies.action_tokenizer import bin_log_softmax
from policies.base import position_ids_from_mask
from policies.normalization import ActionStatistics, fit_bounds_q99
from policies.openvla.checkpoint_prismatic import CONFIG_FILE, architecture_from_config, read_config
from policies.openvla.policy_base import PrismaticPolicy
from policies.openvla.processor_openvla import PROPRIO, check_observation
from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
from policies.openvla_oft.heads_openvla_oft import (
    L1RegressionActionHead,
    ProprioProjector,
    load_module_checkpoint,
    module_checkpoint_mismatch,
)
from policies.sampling import sample_categorical


def parallel_decoding_mask(prefix_mask: Tensor, num_action_positions: int, dtype: torch.dtype) -> Tensor:
    """Additive attention mask of ``[prefix, action placeholders, stop]``: every query may attend
    every key that is not padding (OpenVLA-OFT's bidirectional attention: the module docstring).

    Args:
        prefix_mask: ``(batch, L)`` 0/1 mask of the multimodal prefix.
        num_action_positions: ``chunk_size * action_dim``.
        dtype: the decoder's dtype.

    Returns:
        ``(batch, 1, S, S)`` with ``S = L + num_action_positions + 1``: 0 where allowed, the
        dtype's minimum elsewhere.
    """
    batch, prefix_len = prefix_mask.shape
    total = prefix_len + num_action_positions + 1
    valid = torch.cat([prefix_mask.bool(), prefix_mask.new_ones(batch, total - prefix_len).bool()], dim=1)  # (B, S)
    allowed = valid[:, None, :].expand(batch, total, total)  # (B, S, S): the fork's last causal row, for every query
    mask = torch.zeros(allowed.shape, dtype=dtype, device=prefix_mask.device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


@register_policy
class OpenVLAOFTPolicy(PrismaticPolicy):
    """OpenVLA-OFT as an RL policy: ``chunk_size`` actions per observation, each dimension a
    categorical over the 256 action bins (``action_head="discrete"``), or the L1-regression
    head for supervised use (``"l1_regression"``).

    Args:
        config: the policy's :class:`OpenVLAOFTPolicyConfig`.

    Raises:
        TypeError: ``config`` is not an :class:`OpenVLAOFTPolicyConfig`.
        FileNotFoundError, ValueError: see :class:`~policies.openvla.policy_base.PrismaticPolicy`;
            a checkpoint lacks the action head / proprio projector file the config needs.
    """

    name = "openvla_oft"
    config_class = OpenVLAOFTPolicyConfig

    def __init__(self, config: OpenVLAOFTPolicyConfig, device: torch.device | str | None = None) -> None:
        if not isinstance(config, OpenVLAOFTPolicyConfig):
            raise TypeError(f"OpenVLAOFTPolicy needs an OpenVLAOFTPolicyConfig, got {type(config).__name__}")
        super().__init__(config, device)
        llm_dim = self.architecture.llm_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed + 1)
            self.action_head = (
                L1RegressionActionHead(llm_dim, config.action_dim) if config.action_head == "l1_regression" else None
            )
            self.proprio_projector = ProprioProjector(config.proprio_dim, llm_dim) if config.proprio_dim else None
        # Proprio q01/q99 (OFT's bounds_q99 normalisation), unused (proprio_statistics_set False)
        # until a checkpoint's statistics or fit_observation_normalization set them; buffers, so
        # that training checkpoints keep them. Every buffer stays finite: checkpoints refuse inf/NaN.
        proprio_shape = (config.proprio_dim or 0,)
        self.register_buffer("proprio_q01", torch.zeros(proprio_shape))
        self.register_buffer("proprio_q99", torch.zeros(proprio_shape))
        self.register_buffer("proprio_statistics_set", torch.tensor(False))
        # Proprio statistics of another dataset than the policy's own (a LIBERO task of another
        # suite, use_tasks); None: the buffers'.
        self._task_proprio_statistics: ActionStatistics | None = None
        if config.model_path is not None:
            self._load_oft_modules(Path(config.model_path))
        dtype = getattr(torch, config.dtype)
        for module in (self.action_head, self.proprio_projector):
            if module is not None:
                module.to(dtype=dtype)
        self.to(device)
        self.eval()

    @property
    def chunk_size(self) -> int:
        """Actions per observation (``config.chunk_size``)."""
        return self.config.chunk_size

    @property
    def discrete_actions(self) -> bool:
        """True for the bin head, False for the L1-regression head."""
        return self.config.action_head == "discrete"

    @classmethod
    def without_action_distribution(cls, config: OpenVLAOFTPolicyConfig) -> tuple[str, str] | None:
        """``("action_head", reason)`` for the L1-regression head (a point estimate, no
        distribution: sampling and log-probs are undefined), None for the discrete head."""
        if config.action_head == "discrete":
            return None
        reason = (f"{config.action_head!r} regresses one action chunk per observation (OpenVLA-OFT's predict_action) "
                  "and has no action distribution to sample from or to score; it acts only under the greedy protocol "
                  "(action_head 'discrete' for sampling and RL)")
        return "action_head", reason

    def action_hidden_states(self, obs: TensorDict) -> Tensor:
        """The parallel pass: final hidden states at the action positions.

        Args:
            obs: observation TensorDict, model inputs or simulator observations (see
                :class:`~policies.openvla.policy_base.PrismaticPolicy`); ``proprio`` needed when
                ``config.proprio_dim`` is set, raw units, normalised with
                :attr:`proprio_statistics` when set.

        Returns:
            ``(batch, chunk_size * action_dim, llm_dim)``, step-major (``[step0 dim0, step0
            dim1, ...]``).

        Raises:
            ValueError: a malformed observation (the message names the key).
        """
        config = self.config
        obs = self.model_inputs(obs)
        check_observation(obs, config.num_images, config.proprio_dim)
        extra = None
        if self.proprio_projector is not None:
            proprio = obs[PROPRIO].to(self.device)
            statistics = self.proprio_statistics
            if statistics is not None:
                proprio = statistics.normalize(proprio)
            extra = self.proprio_projector(proprio.to(self.vla.language_model.dtype))[:, None]  # (B, 1, D)
        prefix, prefix_mask = self._prefix(obs, extra)
        batch, prefix_len, width = prefix.shape
        num_actions = config.chunk_size * config.action_dim
        stop = self.vla.embed_tokens(torch.full((batch, 1), config.stop_token_id, device=prefix.device))
        embeddings = torch.cat([prefix, prefix.new_zeros(batch, num_actions, width), stop], dim=1)
        flat_mask = torch.cat([prefix_mask, prefix_mask.new_ones(batch, num_actions + 1)], dim=1)
        hidden = self.vla.language_model.model(
            inputs_embeds=embeddings,
            attention_mask=parallel_decoding_mask(prefix_mask, num_actions, embeddings.dtype),
            position_ids=position_ids_from_mask(flat_mask),
            use_cache=False,
        ).last_hidden_state
        return hidden[:, prefix_len - 1 : prefix_len - 1 + num_actions]

    def action_logits(self, obs: TensorDict) -> Tensor:
        """Full-vocabulary logits of every action value: ``(batch, chunk_size, action_dim,
        vocab)`` (the LM head on :meth:`action_hidden_states`)."""
        logits = self.vla.language_model.lm_head(self.action_hidden_states(obs))
        return logits.unflatten(1, (self.chunk_size, self.action_dim))

    @torch.no_grad()
    def sample_actions(
        self,
        obs: TensorDict,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        temperature: float | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Sample every bin of the chunk from one parallel pass (or take the argmax bins).

        Args:
            obs: observation TensorDict.
            greedy: the most likely bin of each value.
            generator: random generator (on any device: :func:`policies.sampling.draw`); the global one if ``None``.
            temperature: default ``config.temperature``; the log-probs are at this temperature.

        Returns:
            ``actions`` ``(batch, chunk_size, action_dim)`` float32 bin values and ``log_probs``
            ``(batch, chunk_size)`` float32 (summed over dimensions).

        Raises:
            ValueError: the L1-regression head (no distribution: use
                :meth:`predict_action_chunk`), a malformed observation or temperature.
        """
        self._require_discrete("sample_actions")
        temperature = self.config.temperature if temperature is None else temperature
        log_softmax = bin_log_softmax(self.action_tokenizer.bin_logits(self.action_logits(obs)), temperature)
        if greedy:
            bins = log_softmax.argmax(-1)
        else:
            bins = sample_categorical(log_softmax.exp(), generator)  # (B, chunk, A)
        log_probs = log_softmax.gather(-1, bins[..., None]).squeeze(-1)  # (B, chunk, A)
        return self.action_tokenizer.actions_from_bins(bins), log_probs.sum(-1)

    def log_prob_and_entropy_per_dim(
        self, obs: TensorDict, actions: Tensor, temperature: float | None = None
    ) -> tuple[Tensor, Tensor]:
        """Log-probability and entropy of each action value under its 256-bin softmax.

        Args:
            obs: observation TensorDict.
            actions: ``(batch, chunk_size, action_dim)`` bin values.
            temperature: default ``config.temperature``.

        Returns:
            ``log_probs`` and ``entropy``, each ``(batch, chunk_size, action_dim)`` float32,
            differentiable.

        Raises:
            ValueError: the L1-regression head, malformed ``obs``/``actions``, bad temperature.
        """
        self._require_discrete("log_prob_and_entropy_per_dim")
        temperature = self.config.temperature if temperature is None else temperature
        self._check_actions(actions, obs.batch_size[0], "actions")
        bins = self.action_tokenizer.bins_from_actions(actions).to(self.device)
        log_softmax = bin_log_softmax(self.action_tokenizer.bin_logits(self.action_logits(obs)), temperature)
        # a copy, not the squeeze's view: FSDP2 warns of a sharded module returning a view (an
        # in-place op on it would skip the module's pre-backward all-gather)
        log_probs = log_softmax.gather(-1, bins[..., None]).squeeze(-1).clone()
        entropy = -(log_softmax.exp() * log_softmax).sum(-1)
        return log_probs, entropy

    @torch.no_grad()
    def predict_action_chunk(self, obs: TensorDict) -> Tensor:
        """Deterministic chunk: the argmax bins' values (discrete) or the L1 head's regression,
        as moojink/openvla-oft's ``OpenVLAForActionPrediction._regression_or_discrete_prediction``
        (``prismatic/extern/hf/modeling_prismatic.py``) computes them for ``predict_action``:
        ``action_head.predict_action`` on the action positions' last hidden states, unclipped.

        Args:
            obs: observation TensorDict, batch ``batch``.

        Returns:
            ``(batch, chunk_size, action_dim)`` float32 normalised actions (feed
            :meth:`env_actions`, which de-normalises them as ``predict_action`` does).

        Raises:
            ValueError: a malformed observation (the message names the key).
        """
        if self.action_head is None:
            return self.sample_actions(obs, greedy=True)[0]
        return self.action_head(self.action_hidden_states(obs)).float()

    def bc_loss(self, obs: TensorDict, expert_actions: Tensor) -> Tensor:
        """Supervised loss on demonstrated chunks: OFT's L1 loss of the regression head, or the
        cross-entropy of the expert's action tokens over the whole vocabulary (discrete head,
        OpenVLA's LM loss), averaged over batch, steps and dimensions.

        Args:
            obs: observation TensorDict.
            expert_actions: ``(batch, chunk_size, action_dim)`` normalised actions.

        Returns:
            a differentiable scalar.

        Raises:
            ValueError: malformed ``obs`` or ``expert_actions``.
        """
        self._check_actions(expert_actions, obs.batch_size[0], "expert_actions")
        expert_actions = expert_actions.to(self.device)
        if self.action_head is not None:
            predicted = self.action_head(self.action_hidden_states(obs))
            return F.l1_loss(predicted.float(), expert_actions.float())
        tokens = self.action_tokenizer.tokens_from_bins(self.action_tokenizer.bins_from_actions(expert_actions))
        return F.cross_entropy(self.action_logits(obs).float().flatten(0, 2), tokens.flatten())

    @property
    def proprio_statistics(self) -> ActionStatistics | None:
        """The proprio's q01/q99 (every feature normalised), or None: proprio stays raw. Those of
        the dataset :meth:`use_tasks` picked when it is not the policy's own, else the buffers
        (the checkpoint's statistics of the own dataset, or fitted ones)."""
        if self._task_proprio_statistics is not None:
            return self._task_proprio_statistics
        return self._own_proprio_statistics()

    def _own_proprio_statistics(self) -> ActionStatistics | None:
        """The buffers' proprio statistics, or None when unset."""
        if not bool(self.proprio_statistics_set) or self.proprio_q01.numel() == 0:
            return None
        return ActionStatistics(self.proprio_q01, self.proprio_q99, torch.ones_like(self.proprio_q01, dtype=torch.bool))

    def _use_statistics(self, key: str) -> None:
        """Dataset ``key``'s action statistics and, with a proprio input, its ``"proprio"`` entry
        (``get_vla_action`` normalises the proprio with ``norm_stats[unnorm_key]["proprio"]``,
        moojink/openvla-oft ``experiments/robot/openvla_utils.py``): into the buffers when ``key``
        becomes the policy's own, for the next rollouts only when it is another dataset's.

        Raises:
            ValueError: see :meth:`PrismaticPolicy._use_statistics`; another dataset's statistics
                have no ``"proprio"`` entry.
        """
        had_own_key = self.unnorm_key is not None
        super()._use_statistics(key)
        self._task_proprio_statistics = None
        if self.proprio_projector is None:
            return
        if not had_own_key:
            self._load_proprio_statistics()
        elif key != self.unnorm_key:
            proprio = self.norm_stats[key].get("proprio")
            if proprio is None:
                raise ValueError(f"{self._statistics_source}: statistics of {key!r} have no 'proprio' entry, which "
                                 "normalises the proprio input; set policy.config.unnorm_key")
            self._task_proprio_statistics = ActionStatistics.from_dict(proprio, f"{self._statistics_source}[{key!r}] "
                                                                                "proprio statistics")

    def _load_proprio_statistics(self) -> None:
        """The own dataset's ``"proprio"`` statistics into the buffers, when the checkpoint has them."""
        proprio = self.norm_stats[self.unnorm_key].get("proprio") if self.unnorm_key is not None else None
        if proprio is not None:
            statistics = ActionStatistics.from_dict(proprio, f"{self._statistics_source} proprio statistics")
            self.proprio_q01.copy_(statistics.q01)
            self.proprio_q99.copy_(statistics.q99)
            self.proprio_statistics_set.fill_(True)

    def fit_observation_normalization(self, obs: TensorDict) -> None:
        """Set the proprio statistics to the 1st and 99th percentiles of the observations'
        proprio (OFT normalises proprio with its dataset's q01/q99, ``bounds_q99``); no-op
        without a proprio input.

        Args:
            obs: simulator observations or model inputs, batch size ``(batch,)``.
        """
        if self.proprio_projector is None:
            return
        # (B, proprio_dim): of simulator observations the state alone (not the frames' preparation)
        simulator_obs = PROPRIO not in obs.keys() and self.processor is not None
        proprio = (self.processor.proprio(obs) if simulator_obs else obs[PROPRIO]).float()
        q01, q99 = fit_bounds_q99(proprio)
        self.proprio_q01.copy_(q01)
        self.proprio_q99.copy_(q99)
        self.proprio_statistics_set.fill_(True)

    def _require_discrete(self, method: str) -> None:
        if not self.discrete_actions:
            raise ValueError(
                f"{method} needs action_head='discrete': the L1-regression head has no action distribution "
                "(use predict_action_chunk and bc_loss)"
            )

    def save_pretrained(self, out_dir: str | Path, vision_backbone_id: str | None = None) -> Path:
        """Write the policy in OpenVLA-OFT's published layout: the VLA (see
        :meth:`PrismaticPolicy.save_pretrained`), each head module it uses as
        ``<module>--checkpoint.pt`` (a state dict, as OFT's fine-tuning saves them), and the
        proprio statistics (when set) as the ``"proprio"`` entry of the dataset statistics, so
        that ``model_path`` loads it back.

        OpenVLA's statistics file keeps the proprio's entry per dataset, next to the action's: a
        policy without action statistics (actions already in the simulator's [-1, 1], as on
        robosuite) gets a pass-through action entry under ``"config"`` (``mask`` all False, which
        OpenVLA's un-normalisation leaves as they are), the key a policy built from
        ``config.action_statistics`` uses.

        Raises:
            FileExistsError: ``out_dir`` exists.
            ValueError: LoRA adapters are injected (call :meth:`merge_lora` first).
        """
        norm_stats = copy.deepcopy(self.norm_stats)
        statistics = self._own_proprio_statistics()
        if statistics is not None:
            key = self.unnorm_key
            if key not in norm_stats:  # no action statistics (self.action_statistics is None)
                key = "config"
                norm_stats[key] = {"action": {"q01": [-1.0] * self.action_dim, "q99": [1.0] * self.action_dim,
                                              "mask": [False] * self.action_dim}}
            norm_stats[key]["proprio"] = {"q01": statistics.q01.tolist(), "q99": statistics.q99.tolist(),
                                          "mask": statistics.mask.tolist()}
        extra = {f"{stem}--checkpoint.pt": functools.partial(_save_state, module)
                 for stem, module in (("action_head", self.action_head), ("proprio_projector", self.proprio_projector))
                 if module is not None}
        return self._write_pretrained(out_dir, vision_backbone_id, norm_stats, extra)

    @classmethod
    def check_pretrained(cls, config: OpenVLAOFTPolicyConfig, require_tokenizer: bool = True) -> None:
        """:meth:`PrismaticPolicy.check_pretrained`, and the ``<module>--*checkpoint.pt`` file of
        each head module the config uses (action head, proprio projector): exactly one each, whose
        tensor names and shapes fit the module the config builds (``proprio_dim``, ``action_dim``).

        A checkpoint OFT fine-tuned with a continuous head is refused for what it cannot do:
        with a diffusion head (``noisy_action_projector--*``), which vla-rl does not run; with an
        L1-regression head (``action_head--*``) under ``action_head: discrete``, since OFT's
        ``finetune.py`` then trains the head alone (an L1 loss on the action hidden states) and
        never the action tokens that the discrete head samples and scores.

        Raises:
            FileNotFoundError, ValueError: the first problem; the message names the file
                (:class:`~policies.checkpoint_files.FieldError` ``action_head`` for the head,
                ``proprio_dim`` or ``action_dim`` for a module file of other shapes).
        """
        from policies.checkpoint_files import FieldError

        super().check_pretrained(config, require_tokenizer)
        if config.model_path is None:
            return
        directory = Path(config.model_path)
        if diffusion := sorted(directory.glob("noisy_action_projector--*checkpoint.pt")):
            raise FieldError(f"{config.model_path}: an OpenVLA-OFT checkpoint with a diffusion action head "
                             f"({diffusion[0].name}), which vla-rl does not run (it runs OFT's action tokens, "
                             "action_head: discrete, or its L1-regression head)", "action_head")
        heads = sorted(directory.glob("action_head--*checkpoint.pt"))
        if config.action_head == "discrete" and heads:
            raise FieldError(f"{config.model_path} was fine-tuned with OFT's L1-regression head ({heads[0].name}), "
                             "which trains that head alone, never the action tokens that action_head: discrete "
                             "samples for RL; set action_head: l1_regression to load it (its regression: "
                             "predict_action_chunk, no RL), or start RL from a checkpoint fine-tuned on OFT's action "
                             "tokens", "action_head")
        used = {"action_head": config.action_head == "l1_regression", "proprio_projector": config.proprio_dim is not None}
        llm_dim = architecture_from_config(read_config(directory), str(directory / CONFIG_FILE)).llm_dim
        for stem in (stem for stem, needed in used.items() if needed):
            files = sorted(Path(config.model_path).glob(f"{stem}--*checkpoint.pt"))
            if len(files) != 1:
                found = f"several: {[f.name for f in files]}" if files else "none"
                raise ValueError(f"{config.model_path}: needs one {stem}--*checkpoint.pt for the config's {stem} "
                                 f"({found})")
            with torch.device("meta"):
                module = (L1RegressionActionHead(llm_dim, config.action_dim) if stem == "action_head"
                          else ProprioProjector(config.proprio_dim, llm_dim))
            mismatch = module_checkpoint_mismatch(module, files[0])
            if mismatch:  # the constructor's strict load would refuse it, in every worker
                raise FieldError(f"{files[0]} does not fit the config's {stem}: {mismatch.describe()}",
                                 "proprio_dim" if stem == "proprio_projector" else "action_dim")

    def _load_oft_modules(self, directory: Path) -> None:
        for module, stem in ((self.action_head, "action_head"), (self.proprio_projector, "proprio_projector")):
            if module is not None and not load_module_checkpoint(module, directory, stem):
                raise ValueError(f"{directory} has no {stem}--*checkpoint.pt, which the config needs")
        if self.proprio_projector is not None:
            self._load_proprio_statistics()


def _save_state(module: torch.nn.Module, path: Path) -> None:
    """``torch.save`` of ``module``'s state dict (CPU tensors) at ``path``."""
    torch.save({name: tensor.detach().cpu() for name, tensor in module.state_dict().items()}, path)
