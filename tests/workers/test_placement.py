"""Where workers run: the device kind from the cluster's resources, each worker's bundle, the
refusal of NCCL ranks sharing one GPU, the refusal of a cluster too small for the run (in one line
naming what is missing), and a wait for placement that Ctrl-C ends (vla_rl/workers/placement.py).
The same refusal and Ctrl-C through the command line on a `ray start` cluster:
tests/test_ray_start_cluster.py."""

from __future__ import annotations

import subprocess
import sys

import pytest
from child_env import child_env
from pydantic import ValidationError

from vla_rl.config import WorkersSection
from vla_rl.dag.errors import TemplateError
from vla_rl.dag.loader import load_template
from vla_rl.errors import RunStopped
from vla_rl.workers import placement
from vla_rl.workers.placement import (
    ClusterTooSmall,
    Footprint,
    busy_note,
    check_accelerator_sharing,
    check_cluster_fits,
    check_simulator_room,
    resolve_device,
    run_footprint,
    simulator_cpus_per_worker,
    worker_bundle,
)

ADDRESS = "127.0.0.1:6390"
MAIN_JOB = Footprint(2, {"CPU": 1.0}, simulator_actors=1, cpus_per_simulator_actor=1.0)


@pytest.mark.parametrize(("kind", "resources", "expected"), [
    ("auto", {"CPU": 16.0, "GPU": 8.0}, "cuda"),
    ("auto", {"CPU": 16.0, "NPU": 8.0}, "npu"),
    ("auto", {"CPU": 16.0, "GPU": 0.0}, "cpu"),
    ("cpu", {"CPU": 16.0, "GPU": 8.0}, "cpu"),
    ("cuda", {"CPU": 2.0}, "cuda"),  # asked for: Ray's placement names the missing GPU
])
def test_auto_picks_the_accelerator_the_cluster_has(kind, resources, expected):
    assert resolve_device(kind, resources) == expected


def test_a_worker_bundle_holds_its_cpus_and_its_accelerator_share():
    workers = WorkersSection(num_cpus_per_worker=4, gpus_per_worker=0.5)
    assert worker_bundle(workers, "cpu") == {"CPU": 4.0}
    assert worker_bundle(workers, "cuda") == {"CPU": 4.0, "GPU": 0.5}
    assert worker_bundle(workers, "npu") == {"CPU": 4.0, "NPU": 0.5}


def test_nccl_ranks_sharing_a_gpu_are_refused_with_the_fields_to_change():
    shared = WorkersSection(gpus_per_worker=0.5)
    with pytest.raises(RunStopped, match=r"workers.gpus_per_worker=0.5 .* workers.collective_backend=gloo"):
        check_accelerator_sharing(shared, "cuda", world_size=2)
    with pytest.raises(RunStopped, match="hccl"):
        check_accelerator_sharing(shared, "npu", world_size=2)
    check_accelerator_sharing(shared, "cuda", world_size=1)
    # an explicit device: refused with the template, naming the field (plan accepted it; train
    # failed after the run directory and Ray, as a traceback)
    with pytest.raises(TemplateError, match=r"field 'workers.gpus_per_worker': workers.gpus_per_worker=0.5 lets 2"):
        load_template("embodied_srpo", ["workers.device=cuda", "workers.gpus_per_worker=0.5"])
    load_template("embodied_srpo", ["workers.device=cuda", "workers.gpus_per_worker=0.5",
                                    "workers.collective_backend=gloo"])
    check_accelerator_sharing(shared, "cpu", world_size=2)
    check_accelerator_sharing(WorkersSection(gpus_per_worker=0.5, collective_backend="gloo"), "cuda", world_size=2)
    check_accelerator_sharing(WorkersSection(gpus_per_worker=1.0), "cuda", world_size=8)


@pytest.mark.parametrize("backend", ["gloo", "cpu:gloo,cuda:nccl", "cpu:gloo,cuda:gloo", "cpu:gloo,npu:hccl", "cuda:nccl,cpu:gloo"])
def test_collective_backend_accepts_torch_backend_strings(backend):
    assert WorkersSection(collective_backend=backend).collective_backend == backend


@pytest.mark.parametrize("backend", ["glo", "cuda:nccl,tpu:xla", "cpu:", ""])
def test_collective_backend_refuses_anything_else(backend):
    with pytest.raises(ValidationError, match="collective_backend"):
        WorkersSection(collective_backend=backend)


def test_the_footprint_counts_the_workers_and_the_simulator_actors_of_embodied_runs_only():
    embodied = load_template("embodied_srpo", ["simulator.actors_per_worker=3", "simulator.num_cpus_per_actor=0.5"])
    footprint = run_footprint(embodied.config, 2, "cuda")
    assert footprint.total() == {"CPU": 2 * (1.0 + 3 * 0.5), "GPU": 2.0}
    assert footprint.breakdown("CPU") == "2 DAG workers x 1 CPU + 6 simulator actors x 0.5 CPU"
    assert run_footprint(embodied.config, 2, "cpu", pools_per_worker=2).total() == {"CPU": 2 * (1.0 + 6 * 0.5)}
    assert simulator_cpus_per_worker(embodied.config) == 1.5
    text = load_template("llm_grpo").config
    assert run_footprint(text, 4, "cpu").total() == {"CPU": 4.0} and simulator_cpus_per_worker(text) == 0


def test_a_cluster_with_too_few_cpus_is_refused_in_one_line_naming_what_is_missing():
    with pytest.raises(ClusterTooSmall) as info:
        check_cluster_fits(MAIN_JOB, [{"CPU": 2.0, "memory": 1e9}], ADDRESS, "PACK")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the Ray cluster at 127.0.0.1:6390 has 2 CPUs in all; this run needs 4 (2 DAG workers "
                              "x 1 CPU + 2 simulator actors x 1 CPU): give the nodes more (`ray start --num-cpus=N`")
    assert "simulator.actors_per_worker" in message and "workers.num_workers" in message


def test_a_cluster_without_the_accelerators_is_refused():
    footprint = Footprint(2, {"CPU": 1.0, "GPU": 1.0})
    with pytest.raises(ClusterTooSmall, match=r"has 1 GPU in all; this run needs 2 \(2 DAG workers x 1 GPU\)"):
        check_cluster_fits(footprint, [{"CPU": 16.0, "GPU": 1.0}], ADDRESS, "PACK")
    check_cluster_fits(footprint, [{"CPU": 16.0, "GPU": 1.0}] * 2, ADDRESS, "PACK")


def test_the_local_instance_without_the_accelerators_is_refused_with_the_ways_out():
    """The Ray instance the driver starts on its own machine: no node ever joins it, so a missing
    accelerator is refused at once instead of waited for (workers.placement_timeout_s)."""
    footprint = Footprint(2, {"CPU": 1.0, "GPU": 1.0})
    with pytest.raises(ClusterTooSmall) as info:
        check_cluster_fits(footprint, [{"CPU": 5.0, "GPU": 0.0}], None, "PACK")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the Ray instance started on this machine has 0 GPUs in all; this run needs 2 (2 DAG "
                              "workers x 1 GPU): run it where they are")
    assert "workers.ray_address" in message and "workers.device=cpu" in message and "CUDA_VISIBLE_DEVICES" in message
    check_cluster_fits(footprint, [{"CPU": 5.0, "GPU": 2.0}], None, "PACK")


def test_too_few_accelerators_name_the_workers_that_fit_them():
    """One GPU, two workers of one GPU each: the refusal names ``workers.num_workers=1`` (and not
    ``auto``, which would take that GPU too); with half a GPU each, 4 workers fit 2 GPUs; no GPU at
    all, no worker count (none fits), and ``auto`` offered (it would take the CPU)."""
    two = Footprint(2, {"CPU": 1.0, "GPU": 1.0})
    with pytest.raises(ClusterTooSmall) as info:
        check_cluster_fits(two, [{"CPU": 16.0, "GPU": 1.0}], None, "PACK")
    # auto would take the same GPU: not offered where the machine has one
    assert "ask for less (workers.num_workers=1 fits its 1 GPU; workers.device=cpu; workers.num_workers" in str(
        info.value)
    halves = Footprint(6, {"CPU": 1.0, "GPU": 0.5})
    with pytest.raises(ClusterTooSmall, match=r"ask for less \(workers.num_workers=4 fits its 2 GPUs; "
                                              r"workers.num_workers, workers.num_cpus_per_worker"):
        check_cluster_fits(halves, [{"CPU": 16.0, "GPU": 1.0}] * 2, ADDRESS, "PACK")
    with pytest.raises(ClusterTooSmall) as info:
        check_cluster_fits(two, [{"CPU": 16.0, "GPU": 0.0}], None, "PACK")
    assert "fits" not in str(info.value) and "workers.device=cpu, or auto, which" in str(info.value)
    with pytest.raises(ClusterTooSmall) as info:  # CPUs: the worker count is the user's to weigh
        check_cluster_fits(MAIN_JOB, [{"CPU": 2.0}], ADDRESS, "PACK")
    assert "fits" not in str(info.value)


def test_a_device_auto_chose_is_named_and_auto_is_not_offered_again():
    """``workers.device=auto`` on a one-GPU machine becomes ``cuda``, and two workers of one GPU
    each do not fit: the message says auto chose it, and offers ``cpu`` (not auto) instead."""
    two = Footprint(2, {"CPU": 1.0, "GPU": 1.0})
    with pytest.raises(ClusterTooSmall) as info:
        check_cluster_fits(two, [{"CPU": 16.0, "GPU": 1.0}], None, "PACK", auto=True)
    message = str(info.value)
    assert message.startswith("the Ray instance started on this machine has 1 GPU in all; this run needs 2 (2 DAG "
                              "workers x 1 GPU; workers.device=auto chose cuda): run it where they are")
    assert "(workers.num_workers=1 fits its 1 GPU; workers.device=cpu; workers.num_workers" in message
    assert "auto, which" not in message and "\n" not in message
    with pytest.raises(ClusterTooSmall) as info:  # a shortage of CPUs: auto's choice is beside the point
        check_cluster_fits(Footprint(2, {"CPU": 4.0, "GPU": 1.0}), [{"CPU": 4.0, "GPU": 2.0}], None, "PACK", auto=True)
    assert "chose" not in str(info.value)


@pytest.mark.e2e
def test_device_auto_on_a_one_gpu_machine_names_the_choice_and_the_fitting_workers(tmp_path):
    """Through the command line, in a child process whose Ray is told the machine has one GPU
    (``RAY_OVERRIDE_RESOURCES``; a Ray an earlier test left in this process would not hear it; the
    check comes before any worker or tensor exists): ``llm_grpo`` (2 workers) with
    ``workers.device=auto`` is refused in one line that names auto's choice and one worker."""
    out = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "vla_rl.cli", "train", "llm_grpo", "workers.device=auto",
                           "trainer.total_steps=1", f"run.output_dir={out}"], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path, env=child_env(RAY_OVERRIDE_RESOURCES='{"GPU": 1}'))
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1 and errors == [
        "error: the Ray instance started on this machine has 1 GPU in all; this run needs 2 (2 DAG workers x 1 GPU; "
        "workers.device=auto chose cuda): run it where they are (a machine or a cluster that has them: "
        "workers.ray_address; CUDA_VISIBLE_DEVICES or ASCEND_RT_VISIBLE_DEVICES decide which accelerators Ray sees "
        "here) or ask for less (workers.num_workers=1 fits its 1 GPU; workers.device=cpu; workers.num_workers, "
        "workers.gpus_per_worker)"], done.stderr[-3000:]
    assert not any(out.iterdir())


@pytest.mark.e2e
def test_a_run_asking_for_accelerators_this_machine_lacks_is_refused_in_seconds(tmp_path, capsys):
    """Through the command line, on the Ray instance the driver starts: ``workers.device=npu`` (no
    machine of the suite has an NPU) used to wait ``workers.placement_timeout_s`` (300 s) for a
    placement that could never come, the same as ``workers.device=cuda`` on a machine without GPUs."""
    from vla_rl.cli import main

    out = tmp_path / "runs"
    assert main(["train", "embodied_srpo", "workers.device=npu", f"run.output_dir={out}"]) == 1
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert errors == [errors[0]] and errors[0].startswith(
        "error: the Ray instance started on this machine has 0 NPUs in all; this run needs 2 (2 DAG workers x 1 NPU)")
    assert not any(out.iterdir())  # the run directory was removed: nothing ran


def test_nodes_too_small_for_a_worker_beside_its_simulators_are_refused():
    """6 CPUs in all, but a worker and its simulator actor need 2 on one node: 3 nodes of 2 hold 3
    workers, 2 nodes of 3 hold only 2."""
    three = Footprint(3, {"CPU": 1.0}, 1, 1.0)
    check_cluster_fits(three, [{"CPU": 2.0}] * 3, ADDRESS, "PACK")
    with pytest.raises(ClusterTooSmall,
                       match=r"need 2 CPUs on one node, and its nodes hold 2 such workers; this run has 3"):
        check_cluster_fits(three, [{"CPU": 3.0}] * 2, ADDRESS, "PACK")


@pytest.mark.parametrize(("strategy", "nodes", "message"), [
    ("STRICT_SPREAD", [{"CPU": 8.0}], r"1 of its 1 nodes can hold one; STRICT_SPREAD puts each of the 2 workers"),
    ("STRICT_PACK", [{"CPU": 2.0}] * 2, r"its largest node holds 1; STRICT_PACK puts all 2 workers on one node"),
])
def test_strict_strategies_need_the_nodes_they_name(strategy, nodes, message):
    with pytest.raises(ClusterTooSmall, match=message):
        check_cluster_fits(MAIN_JOB, nodes, ADDRESS, strategy)


def test_a_cluster_that_holds_the_run_passes_and_a_busy_one_says_the_run_waits():
    check_cluster_fits(MAIN_JOB, [{"CPU": 2.0}] * 2, ADDRESS, "SPREAD")
    check_cluster_fits(MAIN_JOB, [{"CPU": 4.0}], ADDRESS, "STRICT_PACK")
    assert busy_note(MAIN_JOB, {"CPU": 4.0}, ADDRESS) is None
    assert busy_note(MAIN_JOB, {"CPU": 1.0}, ADDRESS) == (
        "the Ray cluster at 127.0.0.1:6390 has 1 CPU free of the 4 this run needs (2 DAG workers x 1 CPU + 2 "
        "simulator actors x 1 CPU); the run waits for other jobs to release them (Ctrl-C stops)")


def test_a_node_given_more_workers_than_it_has_cpus_for_their_simulators_is_refused(monkeypatch):
    import ray

    monkeypatch.setattr(ray.util, "placement_group_table", lambda group: {"bundles_to_node_id": {0: "a", 1: "a"}})
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": "a", "Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 3.0}},
        {"NodeID": "b", "Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 3.0}}])
    with pytest.raises(ClusterTooSmall, match=r"placed DAG workers 0, 1 on node 10.0.0.1 \(Ray node id \w+\), "
                                              r"which has 3 CPUs; .* need 4: set workers.placement_strategy=SPREAD "
                                              r"\(STRICT_SPREAD to wait for nodes other jobs hold\), or start that "
                                              r"node with --num-cpus=4$"):
        check_simulator_room(object(), MAIN_JOB)
    # SPREAD packs them where other jobs hold the other nodes' CPUs: its way out is not SPREAD again
    with pytest.raises(ClusterTooSmall, match=r"need 4: set workers.placement_strategy=STRICT_SPREAD \(SPREAD is a "
                                              r"preference Ray drops when other jobs hold the other nodes' CPUs; "
                                              r"STRICT_SPREAD waits for them\), or start that node with "
                                              r"--num-cpus=4$"):
        check_simulator_room(object(), MAIN_JOB, "SPREAD")
    monkeypatch.setattr(ray.util, "placement_group_table", lambda group: {"bundles_to_node_id": {0: "a", 1: "b"}})
    check_simulator_room(object(), MAIN_JOB)


class NeverPlaced:
    """A placement group Ray never places; ``interrupt_at``: the wait that Ctrl-C ends."""

    def __init__(self, interrupt_at: int | None = None) -> None:
        self.waits, self.interrupt_at = 0, interrupt_at

    def wait(self, timeout_seconds: float) -> bool:
        self.waits += 1
        assert timeout_seconds <= placement.WAIT_POLL_S  # short waits: Python sees Ctrl-C between two
        if self.waits == self.interrupt_at:
            raise KeyboardInterrupt
        return False


@pytest.fixture
def fake_ray(monkeypatch):
    """Ray's cluster queries answered without a cluster; the placement groups removed are recorded."""
    import ray

    removed = []
    monkeypatch.setattr(ray.util, "remove_placement_group", removed.append)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "available_resources", lambda: {})
    monkeypatch.setattr(placement, "WAIT_POLL_S", 0.0)
    return removed


def test_ctrl_c_ends_the_wait_for_placement_and_removes_the_group(fake_ray):
    group = NeverPlaced(interrupt_at=3)
    with pytest.raises(KeyboardInterrupt):
        placement._wait_for_placement(group, WorkersSection(), 2, {"CPU": 1.0})
    assert fake_ray == [group] and group.waits == 3


def test_a_placement_that_times_out_names_the_bundles_and_removes_the_group(fake_ray, monkeypatch, capsys):
    monkeypatch.setattr(placement, "WAIT_NOTICE_S", 0.0)
    group = NeverPlaced()
    # a RunStopped, one line (a RuntimeError traceback before, whose "free" dict lacked the used-up
    # CPU and listed Ray's placement-group resources)
    with pytest.raises(ClusterTooSmall, match=r"could not place 2 DAG workers of \{'CPU': 1.0\} with strategy PACK "
                                              r"within workers.placement_timeout_s=0.05 s \(0 of 2 CPU free\)"):
        placement._wait_for_placement(group, WorkersSection(placement_timeout_s=0.05), 2, {"CPU": 1.0})
    assert fake_ray == [group]
    waiting = capsys.readouterr().err
    assert "waiting for Ray to place 2 DAG workers of {'CPU': 1.0} (PACK); free now: {'CPU': 0.0}" in waiting
