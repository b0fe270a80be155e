"""Starting Ray the project's way (vla_rl.utils.ray_utils)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

START_ON_16_CORES = textwrap.dedent("""
    import multiprocessing
    multiprocessing.cpu_count = lambda: 16  # a 16-core workstation or GPU node
    import ray
    from vla_rl.utils.ray_utils import init_ray
    init_ray(num_cpus=2 * (1.0 + 1 * 1.0) + 1)  # what the driver reserves for the main job: 5.0
    print("CPU", ray.cluster_resources()["CPU"])
    ray.shutdown()
""")


def test_ray_starts_on_a_machine_with_more_cores_than_the_run_reserves():
    """Regression: Ray hands ``min(cpu_count, num_cpus)`` to the raylet as an int32 flag; a float
    ``num_cpus`` (5.0) below the core count made the raylet exit and ``ray.init`` time out.
    A fresh interpreter, so that the patched core count is what Ray reads when it starts."""
    done = subprocess.run([sys.executable, "-c", START_ON_16_CORES], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "CPU 5.0" in done.stdout
