"""The `vla-rl train` commands of README.md and of every page under docs/ plan as written and pass
the checks `vla-rl train` makes before it starts Ray (its input files, checkpoints and simulator
settings; not its optional packages): each is run through `vla-rl plan` with the world size it
names (`workers.num_workers`), then those checks, a model directory
it names (under /data or /models) replaced by a tiny checkpoint of its template's policy in the same
layout (no 7 B model here). A recipe that the engine would refuse after its workers had loaded
eight 7 B models fails here instead. Left out: commands that warm-start from a user's own dataset
(`warm_start.dataset=/data/...`, which no fixture stands for) and `--resume` commands (no run to
resume)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from vla_rl.cli import main
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.preflight import PreflightError, check_simulator, preflight

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(str(page.relative_to(ROOT)) for page in (ROOT / "docs").glob("*.md")))
#: A model directory a page names: a placeholder for the user's own checkpoint.
USER_MODEL = re.compile(r"^policy\.config\.model_path=/(data|models)/\S+$")
USER_DATASET = re.compile(r"^warm_start\.dataset=/data/")


def train_commands(page: str, command: str = "train") -> list[list[str]]:
    """The arguments after `vla-rl train` (or another ``command``) of every such command in
    ``page``'s bash blocks (backslash-continued lines joined)."""
    text = (ROOT / page).read_text()
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            for start, word in enumerate(words):
                if word.endswith("vla-rl") and words[start + 1:start + 2] == [command]:
                    commands.append(words[start + 2:])
    return commands


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
    """``checkpoint(template)``: a tiny checkpoint of the template's policy (its own tiny
    architecture, with action statistics), saved in the policy's published layout, what
    `policy.config.model_path` reads; one per template."""
    from policies import POLICIES
    from vla_rl.dag.loader import load_template

    made: dict[str, Path] = {}

    def checkpoint(template: str) -> Path:
        if template not in made:
            import torch

            policy = load_template(template).config.policy
            config = policy.policy_config()
            low, high = ("mean", "std") if getattr(config, "normalization", None) == "mean_std" else ("q01", "q99")
            config.action_statistics = {low: [-1.0 if low == "q01" else 0.0] * config.action_dim,
                                        high: [1.0] * config.action_dim}
            torch.manual_seed(0)
            directory = tmp_path_factory.mktemp("model") / template
            made[template] = POLICIES.get(policy.name)(config).save_pretrained(directory)
        return made[template]

    return checkpoint


def test_the_pages_hold_train_commands():
    for page in ("README.md", "docs/large_policies.md", "docs/cluster.md", "docs/vla_policies.md"):
        assert len(train_commands(page)) >= 1, page
    assert sum(len(train_commands(page)) for page in PAGES) >= 20


@pytest.mark.parametrize("page", PAGES)
def test_every_train_command_of_the_page_plans(page, tiny_checkpoint, capsys):
    for command in train_commands(page):
        if command[0].startswith("-") or any(USER_DATASET.match(word) for word in command):
            continue  # --resume RUN_DIR, or the user's own dataset
        template = command[0]
        overrides = [word for word in command[1:] if "=" in word and not word.startswith("-")]
        workers = [o.split("=", 1)[1] for o in overrides if o.startswith("workers.num_workers=")]
        overrides = [f"policy.config.model_path={tiny_checkpoint(template)}" if USER_MODEL.match(o) else o
                     for o in overrides if not o.startswith(("workers.ray_address=", "run.output_dir="))]
        status = main(["plan", template, *overrides, "--world-size", workers[-1] if workers else "2"])
        assert status == 0, f"{page}: vla-rl train {shlex.join(command)}\n{capsys.readouterr().err}"
        loaded = load_template(template, overrides)
        try:  # what vla-rl train checks next (vla_rl/driver.py), but the optional packages a user installs
            preflight(loaded, int(workers[-1]) if workers else None)
            check_simulator(loaded.config)
        except (PreflightError, TemplateError) as err:
            pytest.fail(f"{page}: vla-rl train {shlex.join(command)}\n{err}")


def test_every_eval_command_of_a_template_policy_prepares(tmp_path, monkeypatch):
    """`vla-rl eval --policy-from TEMPLATE ...` commands: their model directory replaced by a tiny
    checkpoint of the policy the command configures (its action head included), each prepares its
    evaluation (the pre-flight of the evaluation template, the tasks, the resolved template) as
    written; the simulators' optional packages (LIBERO) are not checked."""
    import torch

    import vla_rl.eval_driver as eval_driver
    import vla_rl.preflight as preflight_module
    from policies import POLICIES

    monkeypatch.setattr(preflight_module, "check_local_packages", lambda config: None)
    monkeypatch.setattr(eval_driver, "check_task_simulators", lambda config, tasks: None)
    commands = [(page, c) for page in PAGES for c in train_commands(page, "eval") if "--policy-from" in c]
    assert {page for page, _ in commands} >= {"README.md", "docs/evaluation.md"}
    for number, (page, command) in enumerate(commands):
        template = command[command.index("--policy-from") + 1]
        overrides = [word for word in command if "=" in word and not word.startswith("-")]
        policy = load_template(template, [o for o in overrides if o.startswith(("policy.", "simulator."))
                                          and not o.startswith(("policy.config.model_path=",
                                                                "policy.config.architecture="))]).config.policy
        config = policy.policy_config()
        config.action_statistics = {"q01": [-1.0] * config.action_dim, "q99": [1.0] * config.action_dim}
        torch.manual_seed(0)
        model = POLICIES.get(policy.name)(config)
        directory = model.save_pretrained(tmp_path / f"model{number}")
        model.tokenizer.save_pretrained(str(directory))
        overrides = [f"policy.config.model_path={directory}" if o.startswith("policy.config.model_path=") else o
                     for o in overrides if not o.startswith("workers.device=")]
        try:
            eval_driver.prepare_eval_dir([], overrides, output=str(tmp_path / f"eval{number}"), policy_from=template)
        except (ValueError, TemplateError) as err:
            pytest.fail(f"{page}: vla-rl eval {shlex.join(command)}\n{err}")


def test_the_template_files_of_docs_algorithms_plan(tmp_path, capsys):
    """docs/algorithms.md's template files (a ``# file: NAME.yaml`` yaml block: the reference node
    that the KL terms need, which no shipped template has) plan as written, from the folder the
    user saves them in, and pass the checks `vla-rl train` makes before it starts Ray."""
    blocks = re.findall(r"```yaml\n# file: (\S+)\n(.*?)```", (ROOT / "docs/algorithms.md").read_text(), flags=re.S)
    assert [name for name, _ in blocks] == ["grpo_kl.yaml"]
    for name, text in blocks:
        (tmp_path / name).write_text(text)
        assert main(["plan", str(tmp_path / name)]) == 0, capsys.readouterr().err
        loaded = load_template(str(tmp_path / name))
        preflight(loaded, None)
        check_simulator(loaded.config)
    order = capsys.readouterr().out.split("phase train:\norder: ")[1].splitlines()[0]
    assert order.startswith("tasks -> rollout -> reference -> reward -> advantage")
    assert loaded.config.algorithm.use_kl_in_reward and loaded.config.algorithm.use_kl_loss
