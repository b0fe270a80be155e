"""The malformed-input table, part 1: templates, overrides and command lines through ``vla-rl``:
each is refused with one red line that says where to look, exit status 2, no traceback, and
nothing written — an existing run directory is left byte for byte as it was.

The rest of the table: prompt files, model directories and checkpoints (tests/test_preflight.py),
code in model directories, GGUF files, data sources and prompt lengths
(tests/test_malformed_text_inputs.py), resumes (tests/test_malformed_resumes.py), simulator
settings and evaluation stores (tests/test_malformed_sim_inputs.py,
tests/evaluation/test_damaged_stores.py). All of it::

    .venv/bin/python -m pytest tests/test_malformed_*.py tests/test_preflight*.py tests/evaluation/test_damaged_stores.py
"""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest

from vla_rl.cli import main
from vla_rl.driver import prepare_run_dir

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")

GOOD_NODES = """
nodes:
  - {id: tasks, role: data, type: data_load}
  - {id: rollout, role: rollout, type: env_interact, deps: [tasks]}
  - {id: reward, role: reward, type: compute, deps: [rollout]}
  - {id: advantage, role: advantage, type: compute, deps: [reward]}
  - {id: actor, role: actor, type: model_train, deps: [advantage]}
"""

#: (case, template file text or None for a built-in template, CLI arguments after the template,
#: text the error line must contain)
TEMPLATE_CASES = [
    ("yaml syntax", "name: x\nnodes: [\n", [], "invalid YAML at line"),
    ("not a mapping", "- a\n- b\n", [], "a template must be a mapping"),
    ("no name", GOOD_NODES, [], "field 'name'"),
    ("no nodes", "name: x\n", [], "field 'nodes'"),
    ("node without id", "name: x\nnodes:\n  - {role: data, type: data_load}\n", [], "non-empty string id"),
    ("duplicated id", "name: x\nnodes:\n  - {id: a, role: data, type: data_load}\n  - {id: a, role: data, type: data_load}\n",
     [], "duplicated node id"),
    ("unknown role", "name: x\nnodes:\n  - {id: a, role: chef, type: data_load}\n", [], "field 'role'"),
    ("unknown type", "name: x\nnodes:\n  - {id: a, role: data, type: bake}\n", [], "field 'type'"),
    ("unknown fn", "name: x\nnodes:\n  - {id: a, role: data, type: data_load, fn: nope}\n", [], "no node function 'nope'"),
    ("unknown dep", "name: x\nnodes:\n  - {id: a, role: data, type: data_load, deps: [b]}\n", [], "unknown dependency 'b'"),
    ("cycle", "name: x\nnodes:\n  - {id: a, role: data, type: data_load, deps: [b]}\n"
              "  - {id: b, role: reward, type: compute, deps: [a]}\n", [], "dependency cycle"),
    ("dp size", "name: x" + GOOD_NODES.replace("deps: [rollout]}", "deps: [rollout], dp_size: 3}"), [],
     "must divide the world size"),
    ("dp size zero", "name: x" + GOOD_NODES.replace("deps: [rollout]}", "deps: [rollout], dp_size: 0}"), [],
     "field 'dp_size'"),
    ("missing base", "name: x\nextends: nowhere.yaml\n" + GOOD_NODES, [], "base template not found"),
    ("unknown top-level key", "name: x\nfoo: 1\n" + GOOD_NODES, [], "field 'foo'"),
    ("config not a mapping", "name: x\nconfig: 3\n" + GOOD_NODES, [], "field 'config'"),
    ("node config key", "name: x" + GOOD_NODES.replace("deps: [tasks]}", "deps: [tasks], config: {greedyy: true}}"),
     [], "config.greedyy"),
    ("cross-phase dep", "name: x" + GOOD_NODES + "  - {id: e, role: evaluator, type: compute, phase: evaluate, deps: [actor]}\n",
     [], "runs in phase 'train'"),
    ("trains nothing", "name: x" + GOOD_NODES.replace("  - {id: actor, role: actor, type: model_train, deps: [advantage]}\n", ""),
     [], "would train nothing"),
    # embodied_ppo without actor_update trained the critic alone and reported +0.0 points
    ("trains no policy", "name: x\nnodes:\n  - {id: tasks, role: data, type: data_load}\n"
                         "  - {id: rollout, role: rollout, type: env_interact, deps: [tasks]}\n"
                         "  - {id: values, role: critic, type: model_inference, deps: [rollout]}\n"
                         "  - {id: reward, role: reward, type: compute, deps: [values]}\n"
                         "  - {id: advantage, role: advantage, type: compute, deps: [reward]}\n"
                         "  - {id: critic_update, role: critic, type: model_train, deps: [advantage]}\n",
     ["algorithm.adv_estimator=gae"], "the train phase updates no policy: its model_train nodes are ['critic_update'], "
     "none of role actor"),
    # a RecursionError traceback from PyYAML
    ("nested a thousand levels deep", "name: x\nconfig: " + "{a: " * 1000 + "{}" + "}" * 1000 + GOOD_NODES, [],
     "invalid YAML: nested too deeply"),
    ("key nobody writes", "name: x\nnodes:\n  - {id: tasks, role: data, type: data_load}\n"
                          "  - {id: advantage, role: advantage, type: compute, deps: [tasks]}\n"
                          "  - {id: actor, role: actor, type: model_train, deps: [advantage]}\n", [],
     "reads batch key"),
]

OVERRIDE_CASES = [
    ("negative steps", "embodied_srpo", ["trainer.total_steps=-1"], "trainer.total_steps"),
    ("infinite lr", "embodied_srpo", ["trainer.lr=inf"], "finite number"),
    ("zero lr", "embodied_srpo", ["trainer.lr=0"], "trainer.lr"),
    # a Ray traceback from the worker before ("Trying to create tensor with negative dimension -5")
    ("negative critic width", "embodied_ppo", ["critic.hidden_sizes=[-5]"], "critic.hidden_sizes[0]"),
    ("typo in a section", "embodied_srpo", ["trainer.totl_steps=3"], "trainer.totl_steps"),
    ("unknown node", "embodied_srpo", ["nodes.nope.dp_size=1"], "unknown node"),
    ("node rename", "embodied_srpo", ["nodes.reward.id=x"], "cannot be renamed"),
    ("robosuite task typo", "embodied_srpo", ["simulator.env.task=Stak"], "single-arm robosuite task"),
    ("unknown simulator", "embodied_srpo", ["simulator.name=nope"], "unknown simulator"),
    ("unknown policy", "embodied_srpo", ["policy.name=nope"], "unknown policy"),
    ("policy config key", "embodied_srpo", ["policy.config.hiden=1"], "policy.config.hiden"),
    ("srpo setting", "embodied_srpo", ["algorithm.srpo.dbscan_eps=-1"], "dbscan_eps"),
    ("gae without a critic", "embodied_srpo", ["algorithm.adv_estimator=gae"], "reads batch key 'values'"),
    ("group of one", "embodied_srpo", ["data.group_size=1"], "data.group_size"),
    # a group of one has all-equal values: the filter dropped every group and dynamic sampling refilled in vain
    ("zero-variance filter of groups of one", "embodied_grpo",
     ["data.group_size=1", "algorithm.adv_estimator=reinforce_plus_plus"], "algorithm.filter_groups.zero_variance"),
    ("dynamic sampling of groups of one", "llm_dapo",
     ["data.group_size=1", "algorithm.adv_estimator=reinforce_plus_plus"], "algorithm.filter_groups.zero_variance"),
    # an episode at its time limit is a failure: leaving it out of the loss would learn from successes only
    ("truncated responses masked in a robot run", "embodied_grpo", ["algorithm.mask_truncated_responses=true"],
     "field 'algorithm.mask_truncated_responses': applies to text responses"),
    # the generator drew in vain inside a worker ("asked for 8000 distinct arithmetic problems")
    ("more generated rows than problems", "llm_grpo", ["text.arithmetic_levels=[add_small]",
                                                       "text.num_generated_test=50"],
     "field 'text.num_generated_train': the generated splits ask for 8000 + 50 distinct problems"),
    ("no workers", "embodied_srpo", ["workers.num_workers=0"], "workers.num_workers"),
    ("nan score", "llm_grpo", ["text.format_score=nan"], "finite number"),
    ("unknown workflow", "embodied_srpo", ["run.workflow=speech"], "run.workflow"),
    ("moved key", "embodied_srpo", ["algorithm.clip_ratio_high=0.3"], "or the settings of a component"),
    ("plugin missing", "embodied_srpo", ["run.imports=[not_a_module_anywhere]"], "cannot import"),
    ("unknown protocol", "embodied_srpo", ["eval.protocols=[fast]"], "eval.protocols"),
    ("unknown device", "embodied_srpo", ["workers.device=tpu"], "workers.device"),
    ("prompts not divisible", "llm_grpo", ["text.prompts_per_step=5"], "multiple of workers.num_workers"),
    ("no skipped updates allowed", "embodied_srpo", ["trainer.max_skipped_updates=0"], "trainer.max_skipped_updates"),
    ("loss setting of another loss", "embodied_srpo", ["algorithm.cpgd.dual_clip_c=3"],
     "the settings of policy loss 'cpgd', which this run does not use"),
    ("unknown key of the selected loss", "embodied_srpo", ["algorithm.policy_loss=cpgd", "algorithm.cpgd.dual_clip_c=3"],
     "unknown key for CPGDConfig"),
    # pydantic reads true as 1: one training step, a unit standard deviation, a 1-step horizon
    ("boolean steps", "embodied_srpo", ["trainer.total_steps=true"], "'trainer.total_steps': true is a boolean"),
    ("boolean policy setting", "embodied_srpo", ["policy.config.init_std=true"],
     "'policy.config.init_std': true is a boolean"),
    ("boolean simulator setting", "embodied_srpo", ["simulator.env.horizon=false"],
     "'simulator.env.horizon': false is a boolean"),
    ("no protocol", "embodied_srpo", ["eval.protocols=[]"], "'eval.protocols': list should have at least 1 item"),
    ("a protocol twice", "embodied_srpo", ["eval.protocols=[greedy,greedy]"], "a protocol listed twice"),
    # ../x made the run directory beside run.output_dir; a/b failed only when the directory was made
    ("run name outside the output directory", "embodied_srpo", ["run.name=../x"],
     "'../x' is not one directory name under run.output_dir"),
    ("run name of two directories", "embodied_srpo", ["run.name=a/b"], "'a/b' is not one directory name"),
    # accepted by plan: NaN losses trained on silently, or a traceback in the first rollout or update
    ("nan clip range", "llm_grpo", ["algorithm.ppo_clip.clip_ratio_high=nan"],
     "'algorithm.ppo_clip.clip_ratio_high': must be a finite number (got 'nan')"),
    ("nan in a nested π0 setting", "embodied_srpo_pi0_lift", ["policy.config.architecture.time_beta_alpha=.nan"],
     "'policy.config.architecture.time_beta_alpha': must be a finite number (got nan)"),
    ("text in a π0 setting", "embodied_srpo_pi0_lift", ["policy.config.architecture.time_beta_alpha=abc"],
     "PI0ModelConfig.time_beta_alpha must be a finite number > 0, got 'abc'"),
    ("negative SigLIP epsilon", "embodied_srpo_pi0_lift", ["policy.config.architecture.vision.layer_norm_eps=-1"],
     "SiglipSpec.layer_norm_eps must be a finite number > 0, got -1"),
    # a TypeError traceback from GemmaSpec(**{'rope_theta': 5})
    ("part of a π0 Gemma spec", "embodied_srpo_pi0_lift", ["policy.config.architecture.expert.rope_theta=5"],
     "PI0ModelConfig.expert: GemmaSpec.__init__() missing 6 required positional arguments"),
    ("text as the OFT tiny image size", "embodied_grpo_oft_lift", ["policy.config.architecture.image_size=abc"],
     "OpenVLAOFTPolicyConfig.architecture.image_size must be an int from 14 (the tiny towers' patch) to 896, "
     "got 'abc'"),
    ("huge OFT tiny image size", "embodied_grpo_oft_lift", ["policy.config.architecture.image_size=1000000"],
     "image_size must be an int from 14"),
    ("OFT tiny fused not a boolean", "embodied_grpo_oft_lift", ["policy.config.architecture.fused=3"],
     "OpenVLAOFTPolicyConfig.architecture.fused must be true or false, got 3"),
    # "Overflow when unpacking long long" in every worker
    ("OFT seed past torch's", "embodied_grpo_oft_lift", ["policy.config.seed=100000000000000000000"],
     "OpenVLAOFTPolicyConfig.seed must be an int from 0 to 2**63 - 1"),
    ("negative π0 seed", "embodied_srpo_pi0_lift", ["policy.config.seed=-1"],
     "PI0PolicyConfig.seed must be an int from 0 to 2**63 - 1, got -1"),
    # the allocator's traceback in every worker: "you tried to allocate 256000000000000 bytes"
    ("LoRA rank past the model's", "llm_grpo", ["policy.lora.rank=1000000000000"],
     "field 'policy.lora.rank': 1000000000000 is above the full rank of every layer it adapts"),
    # "you tried to allocate 1136000000000000 bytes" in every worker
    ("huge generated text model", "llm_grpo", ["text.tiny_hidden_size=1000000000000"],
     "field 'text.tiny_hidden_size': input should be less than or equal to 1024"),
    # a RecursionError traceback from OmegaConf's reading of the value
    ("override nested a thousand levels deep", "embodied_srpo", ["trainer.x=" + "[" * 1000 + "]" * 1000],
     "field 'trainer.x': override trainer.x=...: nested too deeply"),
    # blamed text.train_file and named a temporary file: "row 0 has no column ''"
    ("empty warm-start column", "llm_grpo", ["text.sft_response_column=''"],
     "field 'text.sft_response_column': string should have at least 1 character"),
]


def snapshot(directory: Path) -> dict[str, str]:
    """Every file below ``directory`` (the lock's text aside) and a hash of its bytes."""
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def existing_run(tmp_path_factory):
    """A run directory as a run leaves it (its template, a metrics file, a checkpoint file)."""
    out = tmp_path_factory.mktemp("outputs")
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", "run.name=kept"], None)
    run.close()
    (run.path / "metrics.jsonl").write_text('{"step": 1, "rollout/success_rate": 0.5}\n')
    (run.path / "checkpoints" / "step_00000001").mkdir(parents=True)
    (run.path / "checkpoints" / "step_00000001" / "model.safetensors").write_bytes(b"weights")
    return run.path


def refused(capsys, args: list[str], expected: str) -> str:
    """Run the CLI; check exit 2, one 'error:' line naming ``expected``, no traceback."""
    status = main(args)
    err = capsys.readouterr().err
    assert status == 2, (args, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and expected in " ".join(err.split()), err  # the console may wrap it
    return err


@pytest.mark.parametrize(("case", "text", "args", "expected"), TEMPLATE_CASES, ids=[c[0] for c in TEMPLATE_CASES])
def test_malformed_template_files(case, text, args, expected, tmp_path, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(textwrap.dedent(text))
    err = refused(capsys, ["plan", str(path), *args], expected)
    assert "t.yaml" in err  # names the file


def test_a_base_named_without_its_suffix_is_named_with_the_paths_looked_at(tmp_path, capsys):
    """`extends: my_base` beside my_base.yaml named only dag_templates/my_base.yaml, which the user
    never meant; a directory read as 'not found'."""
    (tmp_path / "my_base.yaml").write_text("name: base\n")
    (tmp_path / "somedir").mkdir()
    for base, expected in (("my_base", f"base template not found (looked for {tmp_path / 'my_base'} and "),
                           ("my_base", "; the file beside it is my_base.yaml: write extends: my_base.yaml"),
                           ("somedir", f"{tmp_path / 'somedir'} is a directory")):
        (tmp_path / "t.yaml").write_text(f"name: x\nextends: {base}\n" + GOOD_NODES)
        refused(capsys, ["plan", str(tmp_path / "t.yaml")], expected)


def test_non_utf8_template(tmp_path, capsys):
    path = tmp_path / "latin.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1") + GOOD_NODES.encode())
    err = refused(capsys, ["plan", str(path)], "not UTF-8 text")
    assert "latin.yaml" in err


def test_extends_cycle(tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("name: a\nextends: b.yaml\n" + GOOD_NODES)
    (tmp_path / "b.yaml").write_text("name: b\nextends: a.yaml\n")
    refused(capsys, ["plan", str(tmp_path / "a.yaml")], "extends cycle")


@pytest.mark.parametrize(("case", "template", "overrides", "expected"), OVERRIDE_CASES,
                         ids=[c[0] for c in OVERRIDE_CASES])
def test_malformed_overrides(case, template, overrides, expected, capsys):
    refused(capsys, ["plan", template, *overrides], expected)


def test_a_boolean_setting_still_takes_a_boolean(capsys):
    """The boolean refusal above only concerns settings whose type takes no boolean."""
    assert main(["plan", "embodied_srpo", "policy.config.learn_std=false", "trainer.gradient_checkpointing=true",
                 "workers.ray_address=null"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", [["train"], ["train", "--seeds", "0,1"], ["plan"]])
def test_an_override_without_a_value_is_named_as_one(command, tmp_path, capsys):
    """It was "name one template ... (got ['embodied_srpo', 'trainer.total_steps'])", which did
    not say that the value was missing."""
    refused(capsys, [*command, "embodied_srpo", "trainer.total_steps", f"run.output_dir={tmp_path}"],
            "trainer.total_steps: an override sets KEY=VALUE (or deletes ~KEY); give it a value, e.g. "
            "trainer.total_steps=...")
    assert not any(tmp_path.iterdir())  # nothing created
    refused(capsys, [*command, "embodied_srpo", "no_such.yaml"], "name one template")  # a file name: a template


def test_an_evaluation_override_without_a_value_is_named_as_one(tmp_path, capsys):
    """It was "eval.num_episodes is neither a run directory (with checkpoints/) nor a checkpoint directory"."""
    refused(capsys, ["eval", str(tmp_path), "eval.num_episodes"], "eval.num_episodes: an override sets KEY=VALUE")


@pytest.mark.parametrize(("case", "args", "expected"), [
    ("train without a template", ["train"], "name one template"),
    ("resume of nothing", ["train", "--resume", "/nonexistent/run"], "is not a run directory"),
    ("world size 0", ["plan", "embodied_srpo", "--world-size", "0"], None),
    ("eval without a target", ["eval", "eval.num_episodes=3"], "name a run directory"),
    ("eval of nothing", ["eval", "/nonexistent/run"], "/nonexistent/run"),
])
def test_malformed_command_lines(case, args, expected, capsys):
    if expected is None:  # argparse's own usage error: exit 2, no traceback
        with pytest.raises(SystemExit) as info:
            main(args)
        assert info.value.code == 2 and "Traceback" not in capsys.readouterr().err
        return
    refused(capsys, args, expected)


@pytest.mark.parametrize(("case", "args", "expected"), [
    ("reused run name", ["train", "embodied_srpo", "run.output_dir={out}", "run.name=kept"], "already exists"),
    ("resume with a typo", ["train", "--resume", "{run}", "trainer.total_step=6"], "trainer.total_step"),
    ("resume with a bad value", ["train", "--resume", "{run}", "trainer.total_steps=-6"], "trainer.total_steps"),
    ("resume naming another template", ["train", "llm_grpo", "--resume", "{run}"], "remove 'llm_grpo'"),
    ("resume with a bad node override", ["train", "--resume", "{run}", "nodes.reward.dp_size=3"], "dp_size"),
])
def test_an_existing_run_directory_is_never_changed(case, args, expected, existing_run, capsys):
    before = snapshot(existing_run)
    args = [a.format(out=existing_run.parent, run=existing_run) for a in args]
    refused(capsys, args, expected)
    assert snapshot(existing_run) == before


@pytest.mark.parametrize("args, unknown", [(["eval", "--bogus", "run"], "--bogus"), (["export", "a", "b", "--x"], "--x"),
                                           (["plan", "embodied_srpo", "-q"], "-q")])
def test_an_unknown_option_is_named_with_its_commands_usage(args, unknown, capsys):
    """It was reported under the top-level usage (``usage: vla-rl [-h] COMMAND ...``)."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith(f"usage: vla-rl {args[0]} ")
    assert f"vla-rl {args[0]}: error: unrecognized arguments: {unknown}" in err


@pytest.mark.parametrize("fps", ["-5", "0", "nan", "inf", "fast"])
def test_export_episodes_refuses_a_frame_rate_that_is_not_a_positive_number(fps, tmp_path, capsys):
    """--fps -5 was taken, and reached the dataset writer after the sources had been read."""
    with pytest.raises(SystemExit) as info:
        main(["export-episodes", str(tmp_path), str(tmp_path / "out"), "--fps", fps])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --fps: expected a positive number, got" in err
    assert not (tmp_path / "out").exists()
