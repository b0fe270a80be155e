"""Templates and overrides are read as written: a key given twice and YAML 1.1's octal and
base-60 numbers were taken silently (an audit: a second ``config:`` block dropped the first's
settings; ``data.group_size=010`` was 8, ``1:20`` was 80)."""

from __future__ import annotations

import pytest

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.dag.yaml_values import MisreadYAMLError, load_yaml


def test_numbers_and_keys_read_as_written():
    assert load_yaml("a: 10\nb: 0x10\nc: 1_000\nd: 1.5e-4\ne: '010'\nf: \"1:20\"\ng: 0\nh: -3\ni: 0.5") == {
        "a": 10, "b": 16, "c": 1000, "d": 1.5e-4, "e": "010", "f": "1:20", "g": 0, "h": -3, "i": 0.5}
    assert load_yaml("base: &b {x: 1}\nuse:\n  <<: *b\n  y: 2") == {"base": {"x": 1}, "use": {"x": 1, "y": 2}}


@pytest.mark.parametrize(("text", "problem"), [
    ("a: 1\nb: 2\na: 3", "the key 'a' is given twice in one mapping"),
    ("config:\n  trainer: {lr: 1}\nconfig:\n  data: {group_size: 4}", "the key 'config' is given twice"),
    ("a: 010", "010 is the octal number 8 in YAML 1.1: write 10 for the decimal number"),
    ("a: [1, 007]", "007 is the octal number 7"),
    ("a: 1:20", "1:20 is the base-60 number 80 in YAML 1.1"),
    ("a: 1:20.5", "1:20.5 is the base-60 number 80.5"),
])
def test_a_duplicate_key_or_a_misread_number_is_refused_with_its_place(text, problem):
    with pytest.raises(MisreadYAMLError, match=problem) as refused:
        load_yaml(text)
    assert refused.value.problem_mark is not None


def test_templates_and_overrides_refuse_them_naming_the_file_line_and_field(tmp_path):
    template = tmp_path / "twice.yaml"
    template.write_text("extends: embodied_srpo\nconfig:\n  trainer: {lr: 1.0e-3}\nconfig:\n  data: {group_size: 4}\n")
    with pytest.raises(TemplateError, match=r"invalid YAML at line 4, column 1: the key 'config' is given twice"):
        load_template(str(template))
    with pytest.raises(TemplateError, match=r"override 'data.group_size=010': 010 is the octal number 8") as refused:
        load_template("embodied_srpo", ["data.group_size=010"])
    assert refused.value.field == "data.group_size"
    with pytest.raises(TemplateError, match=r"override 'data.group_size=1:20': 1:20 is the base-60 number 80"):
        load_template("embodied_srpo", ["data.group_size=1:20"])
    assert load_template("embodied_srpo", ["data.group_size=10", "run.name='007'"]).config.run.name == "007"
