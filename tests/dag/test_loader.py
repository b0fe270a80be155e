"""Loading templates: YAML, ``extends``, dotted overrides, and every rejection naming node and field."""

from __future__ import annotations

import re

import pytest
import yaml

from vla_rl.config import RunConfig
from vla_rl.dag import loader
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template

from .helpers import DUMMY, node, pipeline


def _error(path_or_name, overrides=()) -> TemplateError:
    with pytest.raises(TemplateError) as info:
        load_template(path_or_name, overrides)
    return info.value


def test_loads_a_valid_template(write_template):
    path = write_template(nodes=pipeline(), config={"trainer": {"total_steps": 3}}, description="d")
    template = load_template(path)
    assert template.name == "t"
    assert template.description == "d"
    assert template.path == path.resolve()
    assert isinstance(template.config, RunConfig)
    assert template.config.trainer.total_steps == 3
    assert [n.id for n in template.nodes] == ["tasks", "rollout", "reward", "adv", "actor"]
    assert template.nodes[1].deps == ("tasks",)
    assert template.nodes[0].fn == DUMMY and template.nodes[0].dp_size is None


def test_bare_name_resolves_in_template_dir(tmp_path, monkeypatch, write_template):
    monkeypatch.setattr(loader, "TEMPLATE_DIR", tmp_path)
    write_template(nodes=pipeline(), name="alpha.yaml")
    write_template(nodes=pipeline(), name="beta.yaml")
    assert load_template("alpha").name == "alpha"
    err = _error("gamma")
    assert err.file.name == "gamma.yaml"
    assert "alpha, beta" in err.message


def test_bad_yaml_names_the_line(write_template):
    path = write_template(text="name: t\nnodes:\n  - id: a\n    role: [data\n")
    err = _error(path)
    assert err.file == path
    assert "invalid YAML at line" in err.message
    assert "line 5" in err.message or "line 4" in err.message


def test_not_a_mapping(write_template):
    err = _error(write_template(text="- a\n- b\n"))
    assert "must be a mapping (got list)" in err.message


def test_unknown_role_lists_allowed(write_template):
    nodes = pipeline()
    nodes[2]["role"] = "rewarder"
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "role")
    assert "'rewarder'" in err.message and "'advantage'" in err.message


def test_unknown_type_lists_allowed(write_template):
    nodes = pipeline()
    nodes[3]["type"] = "compoot"
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("adv", "type")
    assert "'compute'" in err.message


def test_missing_id(write_template):
    nodes = pipeline()
    del nodes[1]["id"]
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == (None, "nodes[1].id")


def test_duplicated_id(write_template):
    nodes = [*pipeline(), node("rollout", "rollout", "env_interact")]
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("rollout", "id")
    assert "duplicated" in err.message


def test_wrong_field_type(write_template):
    nodes = pipeline()
    nodes[2]["dp_size"] = "two"
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("reward", "dp_size")
    assert "'two'" in err.message
    assert str(err).endswith(f"node 'reward': field 'dp_size': {err.message}")


def test_unknown_node_field_lists_allowed(write_template):
    nodes = pipeline()
    nodes[0]["dpsize"] = 1
    err = _error(write_template(nodes=nodes))
    assert (err.node, err.field) == ("tasks", "dpsize")
    assert "unknown key" in err.message and "dp_size" in err.message


def test_wrong_config_type_names_dotted_field(write_template):
    err = _error(write_template(nodes=pipeline(), config={"trainer": {"total_steps": "many"}}))
    assert (err.node, err.field) == (None, "trainer.total_steps")


def test_unknown_config_key_via_override(write_template):
    err = _error(write_template(nodes=pipeline()), ["trainer.total_stepz=5"])
    assert (err.node, err.field) == (None, "trainer.total_stepz")
    assert "unknown key" in err.message and "total_steps" in err.message


def test_overrides_apply_to_config_and_nodes(write_template):
    nodes = pipeline()
    nodes[2]["config"] = {"reward": "success", "scale": 2.0}
    template = load_template(
        write_template(nodes=nodes),
        ["trainer.total_steps=5", "nodes.reward.dp_size=1", "nodes.reward.config.reward=progress"],
    )
    assert template.config.trainer.total_steps == 5
    reward = template.nodes[2]
    assert reward.dp_size == 1
    assert reward.config == {"reward": "progress", "scale": 2.0}
    assert template.raw["nodes"][2]["dp_size"] == 1


def test_override_of_a_node_field_is_type_checked(write_template):
    err = _error(write_template(nodes=pipeline()), ["nodes.reward.dp_size=two"])
    assert (err.node, err.field) == ("reward", "dp_size")


@pytest.mark.parametrize("override", ["trainer.total_steps", "=5", "trainer..lr=1", "nodes.reward=1"])
def test_malformed_override(write_template, override):
    err = _error(write_template(nodes=pipeline()), [override])
    assert "malformed override" in err.message
    assert err.field == (override.partition("=")[0] or None)


@pytest.mark.parametrize("override", ["text.train_file=", "text.train_file=  "])
def test_an_override_without_a_value_is_refused(write_template, override):
    """OmegaConf reads ``KEY=`` as null: ``text.train_file=$TRAIN`` with TRAIN unset trained on the
    generated arithmetic prompts instead of the user's file."""
    err = _error(write_template(nodes=pipeline()), [override])
    assert err.field == "text.train_file" and "has no value: write text.train_file=null for null" in err.message


def test_null_and_empty_collections_are_still_written_out():
    assert load_template("llm_grpo", ["text.train_file=null"]).config.text.train_file is None
    assert load_template("llm_grpo", ["run.imports=[]", "text.chat_template_kwargs={}"]).config.run.imports == []


def test_unknown_node_id_in_override(write_template):
    err = _error(write_template(nodes=pipeline()), ["nodes.rewad.dp_size=1"])
    assert (err.node, err.field) == ("rewad", "dp_size")
    assert "unknown node" in err.message and "reward" in err.message


def test_a_tilde_override_deletes_an_inherited_setting_so_it_takes_its_default(write_template):
    """A mapping override merges into the template's, so ``nodes.reward.config={}`` could not clear
    settings a base set; ``~KEY`` (Hydra's syntax) deletes them, wherever the template got them."""
    nodes = pipeline()
    nodes[2] = {**nodes[2], "fn": "test_dummy_cfg", "config": {"reward": "progress", "scale": 2.0}}
    write_template(nodes=nodes, config={"trainer": {"total_steps": 7, "lr": 0.5}}, name="base.yaml")
    child = write_template(text="name: child\nextends: base.yaml\nconfig: {trainer: {total_steps: 2}}\n")
    template = load_template(child, ["~nodes.reward.config", "~trainer.lr", "nodes.reward.config.scale=3"])
    assert template.nodes[2].config == {"scale": 3}  # the rest takes the node function's defaults
    assert template.config.trainer.lr == RunConfig().trainer.lr and template.config.trainer.total_steps == 2
    assert "lr" not in template.raw["config"]["trainer"]  # the written template reloads the same

    err = _error(child, ["nodes.reward.config={}"])
    assert err.field == "nodes.reward.config"
    assert "changes nothing: a mapping merges into the template's; to reset nodes.reward.config to its " \
           "defaults write ~nodes.reward.config" in err.message
    assert load_template(child, ["trainer.total_steps=3", "text.chat_template_kwargs={}"])  # {} over {}: fine


@pytest.mark.parametrize("override, node, field, message", [
    ("~trainer.nope", None, "trainer.nope", "deletes nothing: the template sets no trainer.nope"),
    ("~nodes.reward.dp_size", None, "nodes.reward.dp_size", "deletes nothing"),
    ("~nodes.reward", None, "nodes.reward", "a node cannot be deleted, only its fields"),
    ("~nodes.reward.role", "reward", "role", "a node's role cannot be deleted"),
    ("~nodes.rewad.config", "rewad", "config", "unknown node"),
    ("~trainer.lr=1", None, "trainer.lr=1", "expected ~KEY with a dotted KEY"),
])
def test_a_tilde_override_that_cannot_apply_is_refused_naming_it(write_template, override, node, field, message):
    err = _error(write_template(nodes=pipeline(), config={"trainer": {"lr": 0.5}}), [override])
    assert (err.node, err.field) == (node, field) and message in err.message, err.message


@pytest.mark.parametrize("overrides, discarded", [
    (["trainer.lr=0.1", "~trainer"], "trainer.lr=0.1"),
    (["trainer={lr: 0.1}", "~trainer.lr"], "trainer={lr: 0.1}"),  # set above the deleted key
    (["trainer.lr=0.1", "~trainer.lr"], "trainer.lr=0.1"),
])
def test_a_commands_deletion_after_its_own_override_is_refused(overrides, discarded):
    """Applied in order, the deletion discarded what the user had just set, silently."""
    with pytest.raises(TemplateError, match=re.escape(f"override {overrides[1]!r} would delete {discarded!r}, given "
                                                      f"before it: put {overrides[1]} first")):
        loader.check_deletion_order(overrides)
    loader.check_deletion_order(overrides[::-1])  # the deletion first: fine


def test_a_resume_may_undo_or_repeat_an_earlier_resumes_override(write_template):
    """A resume applies every earlier resume's overrides, then its own: its ~KEY may undo an
    earlier resume's KEY=VALUE, and repeating an earlier resume's ~KEY (a command from the shell's
    history) deletes nothing more, without an error."""
    path = write_template(nodes=pipeline(), config={"trainer": {"lr": 0.5}})
    earlier = ["trainer.lr=0.1", "~trainer.lr"]
    assert load_template(path, [*earlier, "~trainer.lr"]).config.trainer.lr == RunConfig().trainer.lr
    assert load_template(path, [*earlier, "trainer.lr=0.2", "~trainer"]).config.trainer.lr == RunConfig().trainer.lr


def test_extends_merges_config_and_nodes_by_id(write_template):
    base_nodes = pipeline()
    base_nodes[2] = {**base_nodes[2], "fn": "test_dummy_cfg", "config": {"reward": "success", "scale": 2.0}}
    write_template(
        nodes=base_nodes, config={"trainer": {"total_steps": 7, "lr": 0.5}, "workers": {"num_workers": 4}},
        name="base.yaml", description="base",
    )
    child = write_template(
        text=yaml.safe_dump(
            {
                "name": "child",
                "extends": "base.yaml",
                "config": {"trainer": {"total_steps": 2}},
                "nodes": [
                    {"id": "reward", "dp_size": 2, "config": {"reward": "progress"}},
                    node("critic_like", "reward", "compute", ["rollout"]),
                ],
            }
        ),
        name="child.yaml",
    )
    template = load_template(child)
    assert template.name == "child" and template.description == "base"
    assert (template.config.trainer.total_steps, template.config.trainer.lr) == (2, 0.5)
    assert template.config.workers.num_workers == 4
    assert [n.id for n in template.nodes] == ["tasks", "rollout", "reward", "adv", "actor", "critic_like"]
    reward = template.nodes[2]
    assert (reward.role, reward.fn, reward.dp_size, reward.deps) == ("reward", "test_dummy_cfg", 2, ("rollout",))
    assert reward.config == {"reward": "progress", "scale": 2.0}
    assert "extends" not in template.raw


def test_an_extending_template_names_a_shipped_base_and_drops_a_nodes_settings(write_template, tmp_path,
                                                                              monkeypatch):
    """``extends: embodied_srpo`` from another directory was "base template not found" (a path
    relative to the file), and a child node swapping its function could not drop the settings its
    base gave the old one (config: null was refused, config: {} merged)."""
    from .helpers import DUMMY_WITH_CONFIG

    monkeypatch.setattr(loader, "TEMPLATE_DIR", tmp_path / "shipped")
    (tmp_path / "shipped").mkdir()
    (tmp_path / "mine").mkdir()
    nodes = pipeline()
    nodes[2] = {**nodes[2], "fn": DUMMY_WITH_CONFIG, "config": {"reward": "progress"}}
    write_template(nodes=nodes, config={"trainer": {"total_steps": 7}}, name="shipped/srpo.yaml")
    child = write_template(text="name: mine\nextends: srpo\nnodes:\n  - {id: reward, fn: test_dummy, config: null}\n",
                           name="mine/child.yaml")
    template = load_template(child)
    assert template.config.trainer.total_steps == 7
    assert (template.nodes[2].fn, template.nodes[2].config) == (DUMMY, {})


def test_extends_cycle(write_template):
    write_template(text="name: a\nextends: b.yaml\n", name="a.yaml")
    b = write_template(text="name: b\nextends: a.yaml\nnodes: []\n", name="b.yaml")
    err = _error(b)
    assert err.field == "extends"
    assert "extends cycle: b.yaml -> a.yaml -> b.yaml" in err.message


def test_extends_errors_name_the_base_file(write_template):
    nodes = pipeline()
    del nodes[0]["id"]
    base = write_template(nodes=nodes, name="base.yaml")
    err = _error(write_template(text="name: c\nextends: base.yaml\n", name="c.yaml"))
    assert (err.file, err.field) == (base, "nodes[0].id")


def test_raw_round_trips(write_template, tmp_path):
    template = load_template(write_template(nodes=pipeline()), ["nodes.reward.dp_size=1", "run.seed=3"])
    saved = tmp_path / "resolved.yaml"
    saved.write_text(yaml.safe_dump(template.raw, sort_keys=False))
    again = load_template(saved)
    assert (again.nodes, again.config) == (template.nodes, template.config)


def test_inverted_success_rate_band_is_rejected_naming_the_field(write_template):
    err = _error(write_template(nodes=pipeline()), ["algorithm.filter_groups.success_rate_band=[0.9,0.1]"])
    assert (err.node, err.field) == (None, "algorithm.filter_groups.success_rate_band")
    assert "low <= high" in err.message


def test_a_plug_in_module_not_on_the_path_gets_a_hint(tmp_path, monkeypatch):
    """The extending.md commands, run from the examples' folder without PYTHONPATH=., said only
    "No module named 'toy_penalty'"; the hint names PYTHONPATH, and only for the module itself
    (not for a package the module imports)."""
    with pytest.raises(TemplateError, match=r"cannot import 'toy_missing': ModuleNotFoundError: No module named "
                                            r"'toy_missing' \(is the folder holding toy_missing on PYTHONPATH\?"):
        load_template("embodied_srpo", ["run.imports=[toy_missing]"])
    (tmp_path / "toy_needs_more.py").write_text("import no_such_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TemplateError) as error:
        load_template("embodied_srpo", ["run.imports=[toy_needs_more]"])
    assert error.value.message.endswith("No module named 'no_such_dependency'")


def test_available_templates_are_the_yaml_files_sorted(tmp_path):
    for name in ("zeta.yaml", "alpha.yml", "notes.txt", "mid.yaml"):
        (tmp_path / name).write_text("name: x\n")
    assert loader.available_templates(tmp_path) == ["alpha", "mid", "zeta"]
    assert loader.available_templates(tmp_path / "absent") == []


def test_a_file_name_with_its_suffix_is_a_path_not_a_bare_name(write_template, tmp_path, monkeypatch):
    """``vla-rl plan t.yaml`` in the template's folder reads ./t.yaml, not dag_templates/t.yaml.yaml."""
    write_template(nodes=pipeline(), name="local.yaml")
    monkeypatch.chdir(tmp_path)
    assert loader.resolve_template_path("local.yaml") == (tmp_path / "local.yaml").resolve()
    assert load_template("local.yaml").name == "local"


def test_a_command_s_overrides_apply_after_the_recorded_ones(write_template):
    path = write_template(nodes=pipeline())
    template = load_template(path, ["trainer.lr=0.2"], recorded=["trainer.lr=0.1"])
    assert template.config.trainer.lr == 0.2 and template.overrides == ("trainer.lr=0.2",)


def test_override_of_finds_the_override_above_at_or_below_a_field():
    overrides = ["trainer.lr=0.1", "eval.protocols=[greedy]", "algorithm={clip_ratio: 2}", "~policy.config"]
    assert loader.override_of(overrides, "trainer.lr") == "trainer.lr=0.1"
    assert loader.override_of(overrides, "eval.protocols[0]") == "eval.protocols=[greedy]"  # an item of it
    assert loader.override_of(overrides, "algorithm.clip_ratio") == "algorithm={clip_ratio: 2}"  # a section above
    assert loader.override_of(overrides, "trainer") == "trainer.lr=0.1"  # a setting below
    assert loader.override_of(overrides, "policy.config.init_std") == "~policy.config"
    assert loader.override_of(overrides, "train") is None and loader.override_of(overrides, None) is None


def test_override_settings_leave_out_deletions_and_node_fields():
    overrides = ["~critic.lr", "nodes.reward.dp_size=1", "trainer.lr=0.1", "critic={lr: 0.1}"]
    assert loader.override_settings(overrides) == [("trainer.lr=0.1", "trainer.lr"), ("critic={lr: 0.1}", "critic")]
