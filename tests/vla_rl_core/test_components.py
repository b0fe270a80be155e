"""A plug-in's config class that breaks the contract is refused in one line naming the setting
(it was a bare TypeError traceback from inside the config validation)."""

from __future__ import annotations

import pytest

from vla_rl_core.components import ComponentConfigError, build_config


class NotADataclass:
    clip: float = 0.2


def test_a_config_class_that_is_neither_dataclass_nor_pydantic_model_names_the_setting():
    with pytest.raises(ComponentConfigError, match="is neither a dataclass nor a pydantic model") as error:
        build_config(NotADataclass, {"clip": 0.1}, "algorithm.my_loss")
    assert error.value.field == "algorithm.my_loss"

