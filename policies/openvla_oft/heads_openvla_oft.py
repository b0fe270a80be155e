"""OpenVLA-OFT's extra modules: the L1-regression action head and the proprio projector, with the
parameter names of moojink/openvla-oft so its ``*--<step>_checkpoint.pt`` files load as they are.

Sources (moojink/openvla-oft): ``prismatic/models/action_heads.py`` (``MLPResNetBlock``:
``x + Sequential(LayerNorm, Linear, ReLU)(x)``; ``MLPResNet``: ``LayerNorm → fc1 → ReLU →
blocks → LayerNorm → fc2``; ``L1RegressionActionHead``: ``MLPResNet(num_blocks=2,
input_dim=llm_dim * ACTION_DIM, hidden_dim=llm_dim, output_dim=ACTION_DIM)`` on the hidden
states of one chunk step's ``ACTION_DIM`` positions concatenated) and
``prismatic/models/projectors.py`` (``ProprioProjector``: ``fc1 → GELU → fc2``).
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor, nn
from torch.nn import functional as F

from policies.checkpoint_files import WeightMismatch, compare_shapes, load_pickled_tensors


class MLPResNetBlock(nn.Module):
    """``x + ReLU(Linear(LayerNorm(x)))`` (module name ``ffn`` as published)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ffn = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, dim), nn.ReLU())

    def forward(self, x: Tensor) -> Tensor:
        return x + self.ffn(x)


class MLPResNet(nn.Module):
    """``fc2(LayerNorm(blocks(ReLU(fc1(LayerNorm(x))))))``."""

    def __init__(self, num_blocks: int, input_dim: int, hidden_dim: int, output_dim: int) -> None:
        super().__init__()
        self.layer_norm1 = nn.LayerNorm(input_dim)
        self.fc1 = nn.Linear(input_dim, hidden_dim)
        self.mlp_resnet_blocks = nn.ModuleList([MLPResNetBlock(hidden_dim) for _ in range(num_blocks)])
        self.layer_norm2 = nn.LayerNorm(hidden_dim)
        self.fc2 = nn.Linear(hidden_dim, output_dim)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1RegressionActionHead(nn.Module):
    """Continuous actions from the hidden states of the action positions.

    Args:
        llm_dim: decoder width.
        action_dim: values per action.
    """

    def __init__(self, llm_dim: int, action_dim: int) -> None:
        super().__init__()
        self.action_dim = action_dim
        self.model = MLPResNet(num_blocks=2, input_dim=llm_dim * action_dim, hidden_dim=llm_dim, output_dim=action_dim)

    def forward(self, action_hidden_states: Tensor) -> Tensor:
        """``(batch, chunk * action_dim, llm_dim)`` → ``(batch, chunk, action_dim)`` normalised
        actions (one step's ``action_dim`` hidden states concatenated, as OFT reshapes them)."""
        batch, positions, _ = action_hidden_states.shape
        steps = action_hidden_states.reshape(batch, positions // self.action_dim, -1)  # (B, chunk, A * D)
        return self.model(steps)


class ProprioProjector(nn.Module):
    """Proprio state ``(batch, proprio_dim)`` → one ``(batch, llm_dim)`` token embedding."""

    def __init__(self, proprio_dim: int, llm_dim: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(proprio_dim, llm_dim)
        self.fc2 = nn.Linear(llm_dim, llm_dim)

    def forward(self, proprio: Tensor) -> Tensor:
        return self.fc2(F.gelu(self.fc1(proprio)))


def module_checkpoint_mismatch(module: nn.Module, file: Path) -> WeightMismatch:
    """How the tensors of an OFT module file (``<stem>--*checkpoint.pt``, DDP's ``module.``
    prefix stripped) differ in names and shapes from ``module``'s (which may be on the ``meta``
    device); the file's tensors are not read.

    Raises:
        ValueError: an unreadable file (:func:`~policies.checkpoint_files.load_pickled_tensors`).
    """
    state = load_pickled_tensors(file, "meta")
    found = {name.removeprefix("module."): tuple(tensor.shape) for name, tensor in state.items()}
    return compare_shapes({name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}, found)


def load_module_checkpoint(module: nn.Module, directory: Path, stem: str) -> bool:
    """Load ``<directory>/<stem>--*checkpoint.pt`` (OFT's separate module files, DDP's
    ``module.`` prefix stripped) into ``module``, strictly.

    Returns:
        whether a file was found.

    Raises:
        ValueError: several files match, the file is unreadable, or its state dict does not fit
            ``module``.
    """
    files = sorted(directory.glob(f"{stem}--*checkpoint.pt"))
    if not files:
        return False
    if len(files) > 1:
        raise ValueError(f"{directory} has several {stem} checkpoints {[f.name for f in files]}; keep one")
    state = load_pickled_tensors(files[0])
    state = {name.removeprefix("module."): tensor for name, tensor in state.items()}
    try:
        module.load_state_dict(state)
    except RuntimeError as error:
        raise ValueError(f"{files[0]} does not fit the {stem}: {error}") from None
    return True
