"""The `vla-rl train` commands the GPU and cluster pages give plan as written: each is run through
`vla-rl plan` with the world size it names (`workers.num_workers`), a model directory it names
replaced by a tiny checkpoint in the same layout (no 7 B model here). A recipe that the engine would
refuse after its workers had loaded eight 7 B models fails here instead."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vla_rl.cli import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("docs/large_policies.md", "docs/cluster.md")


def train_commands(page: str) -> list[list[str]]:
    """The arguments after `vla-rl train` of every such command in ``page``'s bash blocks
    (backslash-continued lines joined)."""
    text = (ROOT / page).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for start, word in enumerate(words):
                if word.endswith("vla-rl") and words[start + 1:start + 2] == ["train"]:
                    commands.append(words[start + 2:])
    return commands


@pytest.fixture(scope="module")
def tiny_oft_checkpoint(tmp_path_factory):
    """A tiny OpenVLA-OFT saved in the published layout (what `policy.config.model_path` reads)."""
    import torch

    from policies.openvla_oft import OpenVLAOFTPolicy, OpenVLAOFTPolicyConfig

    torch.manual_seed(0)
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "fused": False}, chunk_size=8,
                                                     proprio_dim=8))
    return policy.save_pretrained(tmp_path_factory.mktemp("oft") / "oft")


def test_the_pages_hold_train_commands():
    assert len(train_commands("docs/large_policies.md")) >= 1
    assert len(train_commands("docs/cluster.md")) >= 1


@pytest.mark.parametrize("page", PAGES)
def test_every_train_command_of_the_page_plans(page, tiny_oft_checkpoint, capsys):
    for command in train_commands(page):
        template, overrides = command[0], [word for word in command[1:] if "=" in word]
        workers = [o.split("=", 1)[1] for o in overrides if o.startswith("workers.num_workers=")]
        overrides = [re.sub(r"=/models/\S+", f"={tiny_oft_checkpoint}", o) for o in overrides
                     if not o.startswith(("workers.ray_address=", "run.output_dir="))]
        status = main(["plan", template, *overrides, "--world-size", workers[-1] if workers else "2"])
        assert status == 0, f"{page}: vla-rl train {shlex.join(command)}\n{capsys.readouterr().err}"
