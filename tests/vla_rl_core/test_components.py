"""A plug-in's config class that breaks the contract is refused in one line naming the setting
(it was a bare TypeError traceback from inside the config validation)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from vla_rl_core.components import ComponentConfigError, build_config


class NotADataclass:
    clip: float = 0.2


def test_a_config_class_that_is_neither_dataclass_nor_pydantic_model_names_the_setting():
    with pytest.raises(ComponentConfigError, match="is neither a dataclass nor a pydantic model") as error:
        build_config(NotADataclass, {"clip": 0.1}, "algorithm.my_loss")
    assert error.value.field == "algorithm.my_loss"



@dataclass(frozen=True)
class Clip:
    clip: float = 0.2
    name: str = "x"
    widths: tuple[float, ...] = (1.0,)
    scales: dict[str, float] | None = None


class ClipModel(BaseModel):
    clip: float = 0.2


@pytest.mark.parametrize("config_class", [Clip, ClipModel])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-Infinity", " +inf", float("nan"), float("-inf")])
def test_non_finite_numbers_are_refused_however_they_are_written(config_class, value):
    """pydantic reads the text 'nan', 'inf', ... as a float: only float values were checked."""
    with pytest.raises(ComponentConfigError, match="must be a finite number") as error:
        build_config(config_class, {"clip": value}, "algorithm.loss")
    assert error.value.field == "algorithm.loss.clip"


@pytest.mark.parametrize(("key", "value", "where"), [("widths", [1.0, "nan"], "widths[1]"),
                                                     ("widths", [float("inf")], "widths[0]"),
                                                     ("scales", {"a": 1, "b": "inf"}, "scales.b")])
def test_non_finite_numbers_inside_lists_and_mappings_are_refused_naming_the_item(key, value, where):
    with pytest.raises(ComponentConfigError, match="must be a finite number") as error:
        build_config(Clip, {key: value}, "policy.config")
    assert error.value.field == f"policy.config.{where}"


def test_text_settings_spelling_nan_and_finite_numbers_pass():
    config = build_config(Clip, {"clip": "0.5", "name": "nan", "widths": [2, "3.5"]}, "policy.config")
    assert (config.clip, config.name, config.widths) == (0.5, "nan", (2.0, 3.5))
