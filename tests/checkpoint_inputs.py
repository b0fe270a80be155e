"""Good inputs of the pre-flight and loading tests (a prompt file, a tiny LM, a tiny OpenVLA-OFT
and a tiny π0 checkpoint) and the helpers that copy and damage them
(tests/test_preflight.py, tests/test_strict_loading.py)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file, save_file

from vla_rl.dag.loader import load_template

TEXT = "llm_grpo"
VLA = "embodied_grpo_oft_lift"
#: The OFT template's policy, loaded from a checkpoint directory instead of the tiny preset.
VLA_FROM_DIR = ["policy.config.architecture=null", "policy.config.proprio_dim=null"]
PI0 = "embodied_grpo_pi0_lift"
#: The π0 template's policy, loaded from a checkpoint directory (its architecture, saved) instead.
PI0_FROM_DIR = ["policy.config.architecture=null"]


@dataclass(frozen=True)
class Assets:
    """Good inputs that the cases copy and damage."""

    train: Path  # parquet, row groups of 16, with extra_info.answer
    test: Path
    lm: Path  # tiny Qwen2 checkpoint
    vla: Path  # tiny OpenVLA-OFT checkpoint (no proprio projector)
    pi0: Path  # tiny π0 checkpoint of the π0 template's architecture, with norm_stats.json


def make_assets(tmp_path_factory, tiny_lm_dir) -> Assets:
    """The good inputs, written under a new temporary directory (a module fixture's body)."""
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy
    from policies.pi0.policy_pi0 import PI0Policy
    from vla_rl.data.arithmetic import write_arithmetic_dataset

    root = tmp_path_factory.mktemp("preflight_assets")
    files = write_arithmetic_dataset(root / "prompts", 200, 64, row_group_size=16)
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "image_size": 56},
                                                     cameras=["agentview"]))
    vla = policy.save_pretrained(root / "vla")
    pi0_config = load_template(PI0).config.policy.policy_config()
    pi0_config.action_statistics = {"q01": [-1.0] * pi0_config.action_dim, "q99": [1.0] * pi0_config.action_dim}
    pi0 = PI0Policy(pi0_config).save_pretrained(root / "pi0")
    return Assets(files["train"], files["test"], Path(tiny_lm_dir), vla, pi0)


# ---------------------------------------------------------------- helpers that damage inputs


def rows(n: int = 8, **replace) -> list[dict]:
    """``n`` rows in the verl format (with ``extra_info.answer``), fields overridden by ``replace``."""
    out = [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "data_source": "vla_rl/arithmetic",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}} for i in range(n)]
    return [{**row, **replace} for row in out]


def parquet(path: Path, table_rows: list[dict], row_group_size: int = 4) -> Path:
    pq.write_table(pa.Table.from_pylist(table_rows), path, row_group_size=row_group_size)
    return path


def jsonl(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def good_lines(n: int = 8) -> list[bytes]:
    return [json.dumps(row).encode() for row in rows(n)]


def copy_dir(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def rewrite_weights(directory: Path, change: Callable[[dict], dict]) -> Path:
    """Rewrite ``model.safetensors`` of a copied checkpoint through ``change``."""
    weights = directory / "model.safetensors"
    save_file(change(load_file(weights)), weights, metadata={"format": "pt"})
    return weights


def resize_vocabulary(directory: Path, vocab_size: int) -> Path:
    """Give a copied tiny LM ``vocab_size`` embedding rows (its config and its weights agree: the
    tokenizer is what no longer fits when fewer); returns its ``config.json``."""
    config_file = directory / "config.json"
    config = json.loads(config_file.read_text())
    old = config["vocab_size"]
    config["vocab_size"] = vocab_size
    config_file.write_text(json.dumps(config))

    def resize(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.shape[0] != old:
            return tensor
        rows = tensor[:vocab_size]
        return torch.cat([rows, rows.new_zeros(vocab_size - len(rows), *tensor.shape[1:])]).contiguous()
    rewrite_weights(directory, lambda state: {name: resize(tensor) for name, tensor in state.items()})
    return config_file


def truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def rename_first_layer(state: dict) -> dict:
    return {name.replace("model.layers.0.", "model.blocks.0."): tensor for name, tensor in state.items()}


def widen(name: str) -> Callable[[dict], dict]:
    def change(state: dict) -> dict:
        tensor = state[name]
        return {**state, name: torch.zeros(tensor.shape[0] + 1, *tensor.shape[1:])}
    return change


def to_pickle(directory: Path) -> Path:
    """Replace the safetensors weights by ``pytorch_model.bin`` (torch's pickle format)."""
    torch.save(load_file(directory / "model.safetensors"), directory / "pytorch_model.bin")
    (directory / "model.safetensors").unlink()
    return directory / "pytorch_model.bin"


def unlink_files(*names: str) -> Callable[[Path], None]:
    """Delete the files ``names`` of a copied checkpoint."""
    def damage(directory: Path) -> None:
        for name in names:
            (directory / name).unlink()
    return damage


def write_file(name: str, data: bytes) -> Callable[[Path], Path]:
    """Write ``data`` as file ``name`` of a copied checkpoint (the file is the offending one)."""
    def damage(directory: Path) -> Path:
        (directory / name).write_bytes(data)
        return directory / name
    return damage


def action_statistics_file(key: str, action_dim: int = 7) -> Callable[[Path], Path]:
    """Write a ``dataset_statistics.json`` of dataset ``key`` (as OpenVLA's checkpoints hold)."""
    bounds = {"q01": [-1.0] * action_dim, "q99": [1.0] * action_dim, "mask": [True] * action_dim}
    return write_file("dataset_statistics.json", json.dumps({key: {"action": bounds}}).encode())


def proprio_projector_file(proprio_dim: int) -> Callable[[Path], Path]:
    """Write an OFT proprio projector file for ``proprio_dim`` proprio values."""
    def damage(directory: Path) -> Path:
        from policies.openvla.checkpoint_prismatic import architecture_from_config, read_config
        from policies.openvla_oft.heads_openvla_oft import ProprioProjector

        llm_dim = architecture_from_config(read_config(directory), "config.json").llm_dim
        path = directory / "proprio_projector--checkpoint.pt"
        torch.save(ProprioProjector(proprio_dim, llm_dim).state_dict(), path)
        return path
    return damage
