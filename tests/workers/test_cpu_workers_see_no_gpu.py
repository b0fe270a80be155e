"""A CPU DAG worker on a machine with GPUs sees none, and its simulator actors still see the
node's GPUs (they render on them). Ray leaves ``CUDA_VISIBLE_DEVICES`` alone for actors that ask
for no GPU, so before this a CPU worker's torch saw every GPU of its node and asked GPU 0 for
its current stream in every optimizer step.

The workers run in a Ray of their own, in a child process: on a CPU machine it is told it has 2
GPUs (``num_gpus=2``, ``CUDA_VISIBLE_DEVICES=0,1``), so that Ray treats the node as a GPU node; on
a GPU test device Ray finds the real ones, and torch's device count is checked as well.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from child_env import child_env
from devices import TEST_DEVICE_KIND, accelerator_count

SCRIPT = r"""
import json, os, sys
import ray, torch
from ray._private import ray_constants
from simulators.pool import simulator_actor_options
from vla_rl.config.sections import WorkersSection
from vla_rl.workers.placement import worker_actor_options

stand_in_gpus = int(sys.argv[1])
if stand_in_gpus:
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, range(stand_in_gpus)))
ray_constants.ENABLE_RAY_CLUSTER = False
ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2,
         num_gpus=stand_in_gpus or None, logging_level="ERROR")


def seen():
    return {"CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"), "torch_gpus": torch.cuda.device_count()}


class Probe:
    def seen(self):
        return seen()

    def simulator_sees(self):
        simulator = ray.remote(Probe).options(**simulator_actor_options({"num_cpus": 0})).remote()
        return ray.get(simulator.seen.remote())


group, options = worker_actor_options(WorkersSection(num_workers=1), "cpu", 1)
worker = ray.remote(Probe).options(**options[0]).remote()
print(json.dumps({"node": seen(), "gpus": ray.cluster_resources().get("GPU", 0), "worker": ray.get(worker.seen.remote()),
                  "simulator": ray.get(worker.simulator_sees.remote())}))
"""


@pytest.mark.e2e
def test_a_cpu_worker_sees_no_gpu_and_its_simulators_see_the_nodes(tmp_path):
    stand_in_gpus = 2 if TEST_DEVICE_KIND == "cpu" else 0
    if TEST_DEVICE_KIND == "npu":
        pytest.skip("checks CUDA_VISIBLE_DEVICES; on Ascend Ray sets ASCEND_RT_VISIBLE_DEVICES alike")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(stand_in_gpus)], capture_output=True, text=True,
                          timeout=240, cwd=tmp_path, env=child_env())
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["gpus"] == (stand_in_gpus or accelerator_count()) > 0, seen
    assert seen["worker"] == {"CUDA_VISIBLE_DEVICES": "", "torch_gpus": 0}, seen
    # the simulator actors keep the node's view (Ray's default for actors without GPUs)
    assert seen["simulator"] == seen["node"], seen
    if TEST_DEVICE_KIND == "cuda":
        assert seen["node"]["torch_gpus"] > 0, seen
