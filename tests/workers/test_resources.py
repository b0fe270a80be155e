"""A node's window on its worker's resources: using one it did not declare stops the run with the
message alone (a plug-in's mistake; it came to the driver as a Ray traceback, exit status 1)."""

from __future__ import annotations

import pytest
import torch

import vla_rl.workflows.base  # noqa: F401  (registers the "policy" resource)
from vla_rl.config import RunConfig
from vla_rl.errors import RunStopped
from vla_rl.workers.resources import Resources, ResourceView, register_resource


def test_a_node_using_a_resource_it_did_not_declare_stops_the_run_naming_both(tmp_path):
    res = Resources(RunConfig.model_validate({}), rank=0, world_size=1, run_dir=tmp_path, device=torch.device("cpu"),
                    rollout_dp_size=1)
    view = ResourceView(res, "reward", frozenset())
    assert view.config is res.config  # the shared facts need no declaration
    # RunStopped: the driver re-raises it as is from the Ray error that carries it (WorkerGroup.collect)
    with pytest.raises(RunStopped, match=r"node 'reward' uses resource 'policy' without declaring it; add it to its "
                                         r"register_node\(resources=\.\.\.\)"):
        view.policy
    with pytest.raises(AttributeError):
        view.no_such_resource


@pytest.mark.parametrize("register, message", [
    (lambda: register_resource("test_no_arg")(lambda: 1),
     r"worker resource 'test_no_arg' \(.*\(\)\) cannot be called as the engine calls it, \(resources\)"),
    (lambda: register_resource("test_str_needs", needs="policy")(lambda res: 1),
     r"worker resource 'test_str_needs': needs must be a tuple of resource names, got 'policy'"),
    (lambda: register_resource("test_iterator_needs", needs=iter(["policy"]))(lambda res: 1),
     r"worker resource 'test_iterator_needs': needs must be a tuple of resource names"),
    (lambda: register_resource("test_bad_close", close=lambda: None)(lambda res: 1),
     r"worker resource 'test_bad_close': its close .* \(resource\)"),
])
def test_a_resource_the_workers_could_not_build_is_refused_when_it_registers(register, message):
    """A builder taking no argument planned and failed in every worker's setup with a bare
    TypeError traceback naming neither the resource nor its module; needs="policy" needed
    resources 'p', 'o', 'l', ..."""
    from vla_rl.workers.resources import RESOURCES

    with pytest.raises(TypeError, match=message):
        register()
    assert not {"test_no_arg", "test_str_needs", "test_iterator_needs", "test_bad_close"} & set(RESOURCES.names())
