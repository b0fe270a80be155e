"""YAML as templates and ``KEY=VALUE`` overrides are read: PyYAML's safe loader (YAML 1.1), refusing
what it would read silently otherwise than it is written.

- A key given twice in one mapping: PyYAML keeps the last, so a second ``config:`` block dropped the
  first one's settings without a word.
- The numbers only YAML 1.1 reads: ``010`` is 8 there (octal, YAML 1.2 and JSON: 10) and ``1:20``
  is 80 (base 60; YAML 1.2: the string ``"1:20"``). Quoted, they are strings as before; ``0o10``,
  ``0x10``, ``1_000`` and the floats are unchanged.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

#: YAML 1.1's octal integers (a leading zero) and base-60 numbers (``1:20``, ``1:20.5``).
_OCTAL = re.compile(r"^[-+]?0[0-9_]+$")
_BASE_60 = re.compile(r"^[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?$")


class MisreadYAMLError(ConstructorError):
    """A duplicate key or a number YAML 1.1 reads otherwise than it shows (its ``problem`` says which)."""


def misread_number(text: str) -> str | None:
    """Why YAML 1.1 reads the plain scalar ``text`` as another number than it shows, or None."""
    text = text.strip()
    if _OCTAL.match(text):
        decimal = text.replace("_", "").lstrip("+-").lstrip("0") or "0"
        return (f"{text} is the octal number {yaml.safe_load(text)} in YAML 1.1: write {decimal} for the decimal "
                f"number, or quote it ('{text}') for the text")
    if _BASE_60.match(text):
        return f"{text} is the base-60 number {yaml.safe_load(text)} in YAML 1.1: quote it ('{text}') for the text"
    return None


class TemplateLoader(yaml.SafeLoader):
    """:class:`yaml.SafeLoader` refusing a duplicate key and YAML 1.1's octal and base-60 numbers
    (:class:`MisreadYAMLError`, marked with the line and column)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # an unhashable key: construct_mapping refuses it
            if key in seen:
                raise MisreadYAMLError(None, None, f"the key {key!r} is given twice in one mapping (the last "
                                       "would win): give it once", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def _number(self, node: yaml.ScalarNode, construct) -> Any:
        if node.style is None and (problem := misread_number(node.value)):
            raise MisreadYAMLError(None, None, problem, node.start_mark)
        return construct(self, node)


TemplateLoader.add_constructor("tag:yaml.org,2002:int",
                               lambda loader, node: loader._number(node, SafeConstructor.construct_yaml_int))
TemplateLoader.add_constructor("tag:yaml.org,2002:float",
                               lambda loader, node: loader._number(node, SafeConstructor.construct_yaml_float))


def load_yaml(text: str) -> Any:
    """``text`` read by :class:`TemplateLoader`.

    Raises:
        MisreadYAMLError: a duplicate key or a misread number (with its line and column).
        yaml.YAMLError: invalid YAML (a :class:`yaml.MarkedYAMLError` where the place is known).
        NestedTooDeeply: nested too deeply for PyYAML's recursive parser.
    """
    try:
        return yaml.load(text, Loader=TemplateLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise NestedTooDeeply("nested too deeply (hundreds of levels of mappings or lists)") from None


class NestedTooDeeply(yaml.YAMLError):
    """YAML nested past what PyYAML's recursive parser (and OmegaConf's, which reads overrides
    with it) can read: a RecursionError otherwise."""
