"""A CPU DAG worker on a machine with GPUs sees none, and its simulator actors still see the
node's GPUs (they render on them). Ray leaves ``CUDA_VISIBLE_DEVICES`` alone for actors that ask
for no GPU, so before this a CPU worker's torch saw every GPU of its node and asked GPU 0 for
its current stream in every optimizer step.

Each test runs a Ray of its own, in a child process. On a CPU machine that Ray is told it has 2
GPUs (``CUDA_VISIBLE_DEVICES=0,1``), so that it treats the node as a GPU node; on a GPU test
device it finds the real ones, and torch's device count is checked as well. The main job's run
adds a stand-in GPU to every process (tests/fixtures/stand_in_gpu), which fails the run where
anything uses it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from child_env import child_env
from devices import TEST_DEVICE_KIND, accelerator_count

STAND_IN_GPU = Path(__file__).parents[1] / "fixtures" / "stand_in_gpu"

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


@pytest.mark.e2e
@pytest.mark.skipif(TEST_DEVICE_KIND != "cpu", reason="the stand-in GPU replaces torch.cuda on a CPU-only torch")
def test_the_main_job_on_a_gpu_node_uses_no_gpu_from_its_cpu_workers_driver_or_simulators(tmp_path):
    """The main job's template for a step on CPU workers, with 2 stand-in GPUs visible to the
    driver, Ray and the simulator actors: behaviour cloning's and the update's Adam steps, the
    checkpoint and the evaluations use none of them (before, the warm start's first Adam step
    asked the stand-in for its current stream in both workers)."""
    log = tmp_path / "stand_in_gpu.log"
    command = [sys.executable, "-m", "vla_rl.cli", "train", "embodied_srpo", "trainer.total_steps=1",
               "trainer.save_every=1", "trainer.ppo_mini_batch_size=4", "trainer.ppo_epochs=1",
               "data.init_states_per_step=2", "data.group_size=3", "simulator.env.horizon=40",
               "algorithm.filter_groups.success_rate_band=null", "eval.num_episodes=4", "eval.video_episodes=1",
               "eval.video_size=32", "warm_start.bc_steps=30", "policy.config.hidden_sizes=[32,32]",
               "workers.device=cpu", f"warm_start.demo_store={tmp_path / 'demos.zarr'}",
               f"run.output_dir={tmp_path}", "run.name=run"]
    env = child_env(STAND_IN_GPU, VLA_RL_STAND_IN_GPU_LOG=str(log), CUDA_VISIBLE_DEVICES="0,1",
                    RAY_OVERRIDE_RESOURCES=json.dumps({"GPU": 2}))
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    used = log.read_text() if log.exists() else ""
    assert not used, used[:4000]
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps_run"] == 1
