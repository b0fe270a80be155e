"""vla_rl_core.registry.Registry: built-ins imported by module name on the first lookup, never by
registering; traits validated when an entry registers."""

from __future__ import annotations

import sys

import pytest
from pydantic import BaseModel, ConfigDict

from vla_rl_core.registry import Registry, RegistryError


class Traits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    reads: tuple[str, ...] = ()
    groups: bool = False


def test_builtins_load_on_the_first_lookup_once(tmp_path, monkeypatch):
    import types

    holder = types.ModuleType("toy_holder")
    holder.registry = Registry("toy", builtins=("toy_builtins",))
    monkeypatch.setitem(sys.modules, "toy_holder", holder)
    (tmp_path / "toy_builtins.py").write_text("import toy_holder\n"
                                              "toy_holder.loads = getattr(toy_holder, 'loads', 0) + 1\n"
                                              "toy_holder.registry.register('builtin')(object)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = holder.registry
    registry.register("own")(int)  # registering imports nothing
    assert "toy_builtins" not in sys.modules
    assert registry.get("own") is int and "toy_builtins" in sys.modules  # the first lookup did
    assert registry.names() == ["builtin", "own"] and holder.loads == 1
    with pytest.raises(RegistryError, match="unknown toy 'nope'; known: builtin, own"):
        registry.get("nope")
    sys.modules.pop("toy_builtins")


def test_a_builtin_module_that_fails_to_import_is_retried():
    registry = Registry("toy", builtins=("no_such_module_here",))
    for _ in range(2):
        with pytest.raises(ModuleNotFoundError):
            registry.get("anything")


def test_traits_are_validated_when_an_entry_registers():
    registry = Registry("estimator", traits=Traits)
    registry.register("plain")(object)
    registry.register("grouped", groups=True, reads=("values",))(object)
    assert registry.traits("plain") == Traits()
    assert registry.traits("grouped").groups and registry.traits("grouped").reads == ("values",)
    with pytest.raises(TypeError, match=r"estimator 'typo' declares invalid traits \(Traits\): group: Extra inputs"):
        registry.register("typo", group=True)
    with pytest.raises(TypeError, match="estimator 'bad' declares invalid traits.*groups"):
        registry.register("bad", groups="sometimes")
    assert "typo" not in registry and "bad" not in registry
    with pytest.raises(TypeError, match="the toy registry takes no traits, got \\['groups'\\]"):
        Registry("toy").register("x", groups=True)
    plain = Registry("toy")
    plain.register("x")(object)
    with pytest.raises(TypeError, match="declares no traits"):
        plain.traits("x")


def test_the_engines_registries_declare_their_traits():
    from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS
    from vla_rl.algorithms.rewards import EMBODIED_REWARDS
    from vla_rl.rewards.trajectory_encoders import TRAJECTORY_ENCODERS

    gae = ADVANTAGE_ESTIMATORS.traits("gae")
    assert gae.reads == ("values",) and gae.batch_statistics
    assert ADVANTAGE_ESTIMATORS.traits("grpo").groups and not ADVANTAGE_ESTIMATORS.traits("grpo").batch_statistics
    assert EMBODIED_REWARDS.traits("srpo").embeddings and not EMBODIED_REWARDS.traits("success").embeddings
    assert TRAJECTORY_ENCODERS.traits("policy_backbone").runtime == ("frame_features",)
    assert TRAJECTORY_ENCODERS.traits("vjepa2").runtime == ("device",)
    assert TRAJECTORY_ENCODERS.traits("state_resample").runtime == ()
