"""A node's window on its worker's resources: using one it did not declare stops the run with the
message alone (a plug-in's mistake; it came to the driver as a Ray traceback, exit status 1)."""

from __future__ import annotations

import pytest
import torch

import vla_rl.workflows.base  # noqa: F401  (registers the "policy" resource)
from vla_rl.config import RunConfig
from vla_rl.errors import RunStopped
from vla_rl.workers.resources import Resources, ResourceView


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
