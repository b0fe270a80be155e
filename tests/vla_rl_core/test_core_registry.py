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


def _toy_modules(tmp_path, monkeypatch, builtins, sources):
    """A registry in module ``toy_holder`` with built-in modules ``sources`` ({module: code})."""
    import types

    holder = types.ModuleType("toy_holder")
    holder.registry = Registry("toy", builtins=builtins)
    monkeypatch.setitem(sys.modules, "toy_holder", holder)
    for module, code in sources.items():
        (tmp_path / f"{module}.py").write_text(f"import toy_holder\n{code}")
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    return holder.registry


def _registers(*names):
    return "".join(f"toy_holder.registry.register({name!r})(type({name!r}, (), {{}}))\n" for name in names)


def test_a_mapped_builtin_imports_its_own_module_only(tmp_path, monkeypatch):
    registry = _toy_modules(tmp_path, monkeypatch, {"small": "toy_small", "large": "toy_large"},
                            {"toy_small": _registers("small"), "toy_large": _registers("large")})
    assert "small" in registry and registry.get("small").__name__ == "small"
    assert registry.config_class("small") is None
    assert "toy_small" in sys.modules and "toy_large" not in sys.modules
    # any other name (the message lists every name), or a listing, imports them all
    with pytest.raises(RegistryError, match="unknown toy 'nope'; known: large, small"):
        registry.get("nope")
    assert "toy_large" in sys.modules and registry.names() == ["large", "small"]


def test_a_plug_in_taking_a_builtins_name_is_refused_naming_both_modules(tmp_path, monkeypatch):
    """A plug-in registering a built-in's name before the built-in loaded was accepted, and the
    built-in then failed to register at the first lookup, with a message naming neither module."""
    import importlib

    sources = {"toy_small": _registers("small"), "toy_plugin": _registers("small")}
    registry = _toy_modules(tmp_path, monkeypatch, {"small": "toy_small"}, sources)
    with pytest.raises(RegistryError, match=r"toy 'small' is a built-in \(toy_small\); toy_plugin registers another: "
                                            "give it another name"):
        importlib.import_module("toy_plugin")  # refused at the plug-in's import, the built-in not imported
    assert "toy_small" not in sys.modules
    registry = _toy_modules(tmp_path, monkeypatch, ("toy_small",), sources)  # built-in modules, names unknown
    importlib.import_module("toy_plugin")
    with pytest.raises(RegistryError, match=r"toy 'small' is already registered \(by toy_plugin\); toy_small "
                                            "registers another"):
        registry.get("small")


def test_a_listing_imports_every_mapped_builtin(tmp_path, monkeypatch):
    registry = _toy_modules(tmp_path, monkeypatch, {"small": "toy_small", "large": "toy_large"},
                            {"toy_small": _registers("small"), "toy_large": _registers("large")})
    registry.register("own")(int)
    assert registry.names() == ["large", "own", "small"] and "toy_large" in sys.modules


def test_check_builtins_finds_a_mapping_that_does_not_match_the_modules(tmp_path, monkeypatch):
    registry = _toy_modules(tmp_path, monkeypatch, {"a": "toy_a", "b": "toy_a", "c": "toy_c"},
                            {"toy_a": _registers("a"), "toy_c": _registers("c", "d")})
    registry.register("own")(int)  # the user's entries are not the mapping's business
    with pytest.raises(RegistryError) as info:
        registry.check_builtins()
    message = str(info.value)
    assert message.startswith("the toy registry's built-ins: ")
    assert "'d' is registered by toy_c, mapped to None" in message
    assert "'b' (mapped to toy_a) is not registered" in message
    assert "'a'" not in message and "'c'" not in message and "own" not in message


def test_the_policy_registry_maps_each_builtin_to_its_module():
    from policies import POLICIES

    POLICIES.check_builtins()
    assert sorted(POLICIES.builtin_modules) == ["mlp", "openvla", "openvla_oft", "pi0"]


def test_a_template_of_the_mlp_policy_loads_and_plans_without_the_vla_policies(tmp_path):
    """What every DAG worker and the driver do first: load the template, plan it. The MLP's
    never imports transformers (1.8 s per process when the registry imported every policy)."""
    import subprocess

    code = ("import sys\n"
            "from vla_rl.dag.loader import load_template\n"
            "from vla_rl.dag.planner import plan\n"
            "plan(load_template('embodied_srpo'))\n"
            "print(sorted(m for m in sys.modules if m == 'transformers' or m.startswith('policies.open')"
            " or m.startswith('policies.pi0')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout


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


def test_a_function_that_cannot_take_the_engines_call_is_refused_when_it_registers():
    def calls(traits):
        return ("rewards", "mask"), ("values", "reduce") if traits.groups else ("values",)

    registry = Registry("estimator", traits=Traits, calls=calls)
    registry.register("exact")(lambda rewards, mask, values=None: None)
    registry.register("loose")(lambda *args, **kwargs: None)
    registry.register("defaults")(lambda rewards, mask, values=None, extra=1: None)
    registry.register("a_class")(type("Built", (), {}))  # built from its config, then called: not checked
    registry.register("grouped", groups=True)(lambda rewards, mask, values=None, reduce=None: None)
    with pytest.raises(TypeError, match=r"estimator 'no_values' \(.*\(rewards, mask\)\) cannot be called as the "
                                        r"engine calls it, \(rewards, mask, values=\.\.\.\): .*'values'"):
        registry.register("no_values")(lambda rewards, mask: None)
    with pytest.raises(TypeError, match=r"'too_many'.*missing a required argument: 'config'"):
        registry.register("too_many")(lambda rewards, mask, config, values=None: None)
    with pytest.raises(TypeError, match=r"'grouped_without_reduce'.*\(rewards, mask, values=\.\.\., reduce=\.\.\.\)"):
        registry.register("grouped_without_reduce", groups=True)(lambda rewards, mask, values=None: None)
    assert {"no_values", "too_many", "grouped_without_reduce"}.isdisjoint(registry.names())


@pytest.mark.parametrize("module, body, named", [
    ("toy_bad_estimator", "from vla_rl.algorithms.advantages import ADVANTAGE_ESTIMATORS\n"
     "@ADVANTAGE_ESTIMATORS.register('toy_bad')\ndef toy_bad(rewards, mask, config):\n    return rewards, rewards\n",
     "advantage estimator 'toy_bad'"),
    ("toy_bad_loss", "from vla_rl.algorithms.policy_loss import POLICY_LOSSES\n"
     "@POLICY_LOSSES.register('toy_bad')\ndef toy_bad(log_probs, old_log_probs, advantages, mask, config):\n"
     "    return 0, {}\n", "policy loss 'toy_bad'"),
    ("toy_bad_reward", "from vla_rl.algorithms.rewards import EMBODIED_REWARDS\n"
     "@EMBODIED_REWARDS.register('toy_bad', step_reference=True)\n"
     "def toy_bad(embeddings, success, task_ids, config):\n    return success.float()\n", "embodied reward 'toy_bad'"),
])
def test_a_plug_in_with_the_wrong_signature_is_refused_at_load_in_one_line(module, body, named, tmp_path,
                                                                            monkeypatch, capsys):
    """It used to load, plan and start the workers, then fail inside one with a Ray traceback."""
    from vla_rl.cli import main

    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["plan", "embodied_grpo", f"run.imports=[{module}]"]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "\n" not in error and "Traceback" not in error, error
    assert f"field 'run.imports': cannot import '{module}': TypeError: {named}" in error, error
    assert "cannot be called as the engine calls it" in error
