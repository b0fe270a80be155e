"""Plug-in components a template names, refused when it loads: a policy class that leaves methods
abstract, a simulator without config_class, a module taking a built-in's name."""

from __future__ import annotations

import pytest
from template_errors import plan_error as _error

from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template


def test_a_policy_class_that_leaves_methods_abstract_is_refused_when_the_template_loads(monkeypatch):
    """A plug-in policy without log_prob_and_entropy_per_dim planned, and its run failed with a
    Ray traceback once a worker built it."""
    import abc

    from policies import POLICIES
    from policies.mlp.modeling_mlp import MLPPolicy

    class Partial(MLPPolicy):  # makes one of Policy's methods abstract again, as a class lacking it is
        name = "partial_toy"

        @abc.abstractmethod
        def log_prob_and_entropy_per_dim(self, *args): ...

    POLICIES.load_builtins()
    monkeypatch.setitem(POLICIES._entries, "partial_toy", Partial)
    err = _error("embodied_srpo", "policy.name=partial_toy")
    assert err.field == "policy.name"
    assert "'partial_toy' (test_config_plugins.test_a_policy_class_that_leaves_methods_abstract_is_refused_when_" \
           "the_template_loads.<locals>.Partial) does not define log_prob_and_entropy_per_dim of policies.base.Policy" \
           in str(err)


def test_a_plug_in_simulator_without_config_class_names_simulator_name(monkeypatch):
    """It was an AttributeError traceback at plan time."""
    from simulators.registry import SIMULATORS

    SIMULATORS.get("robosuite_lift")  # the builtins, registered before the plug-in

    class NoConfigClass:
        pass

    monkeypatch.setitem(SIMULATORS._entries, "no_config_class", NoConfigClass)
    error = _error("embodied_grpo", "simulator.name=no_config_class", "warm_start.num_demos=0")
    assert error.field == "simulator.name" and "has no config_class, the dataclass of its simulator.env" in str(error)


@pytest.mark.parametrize("module, body, message", [
    ("toy_dup_node", "from vla_rl.dag.registry import NodeOutput, register_node\n"
     "register_node('reward', 'compute', reads=('success',), writes=('rewards',))(lambda ctx, batch: NodeOutput())\n",
     "node function ('reward', 'compute', 'default') is already registered (by vla_rl.nodes.reward); toy_dup_node "
     "registers another"),
    ("toy_dup_resource", "from vla_rl.workers.resources import register_resource\n"
     "register_resource('policy')(lambda res: None)\n",
     "worker resource 'policy' is already registered (by vla_rl.workflows.base); toy_dup_resource registers another"),
])
def test_a_plug_in_taking_a_built_in_name_is_the_one_refused(module, body, message, tmp_path, monkeypatch):
    """Imported before the built-ins had loaded, the plug-in took the name, and the built-in's
    module was then blamed for registering "another" (the error named an unrelated node)."""
    (tmp_path / f"{module}.py").write_text(body)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TemplateError) as raised:
        load_template("embodied_srpo", [f"run.imports=[{module}]"])
    err = raised.value
    assert err.field == "run.imports" and f"cannot import '{module}': RegistryError: {message}" in err.message
