"""Tiny OpenVLA-OFT checkpoints whose dataset statistics name LIBERO suites, for the tests of the
statistics key each suite picks (OpenVLA-OFT's ``run_libero_eval.py``, ``check_unnorm_key``)."""

from __future__ import annotations

from pathlib import Path

ACTION_DIM, PROPRIO_DIM = 7, 8


def dataset_statistics(index: int) -> dict:
    """Statistics of dataset ``index``: q01 = index, q99 = index + 2 on every dimension (so a
    normalised 0 de-normalises to index + 1; the gripper is not normalised), proprio likewise."""
    return {"action": {"q01": [float(index)] * ACTION_DIM, "q99": [index + 2.0] * ACTION_DIM,
                       "mask": [True] * (ACTION_DIM - 1) + [False]},
            "proprio": {"q01": [float(index)] * PROPRIO_DIM, "q99": [index + 2.0] * PROPRIO_DIM}}


def libero_checkpoint(directory: Path, datasets: list[str], chunk_size: int) -> Path:
    """A tiny OpenVLA-OFT checkpoint (8-value proprio input, no tokenizer) whose statistics hold
    ``datasets`` in order (:func:`dataset_statistics` of their index); returns its directory."""
    from policies.openvla.tiny import build_tiny_tokenizer, tiny_architecture
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    architecture = tiny_architecture(len(build_tiny_tokenizer()))
    source = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture=architecture, chunk_size=chunk_size,
                                                     proprio_dim=PROPRIO_DIM))
    source.norm_stats = {name: dataset_statistics(i) for i, name in enumerate(datasets)}
    return source.save_pretrained(directory)
