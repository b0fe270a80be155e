"""Latency and throughput of ``vla-rl serve`` against calling the policy in-process.

For each policy of ``--policies`` (``mlp``: the main job's MLP, 15-value state, hidden [256, 256];
``pi0`` and ``oft``: the tiny π0 and OpenVLA-OFT of ``embodied_srpo_pi0_lift`` /
``embodied_srpo_oft_lift``, one 128x128 camera, state and instruction), random weights, greedy:

- **in-process**: :meth:`vla_rl.serving.policy.ServedPolicy.act` on one observation per call, in
  a loop (what a robot program that loads the policy itself would pay), p50 / p99 per call;
- **served**: a :class:`vla_rl.serving.server.PolicyServer` on 127.0.0.1 in this process and
  ``--clients`` client *processes* (1, 4, 16 by default), each a PyPI ``openpi-client``
  ``WebsocketClientPolicy`` sending an observation in openpi's LIBERO-style keys and waiting for
  the reply, back to back, for ``--seconds`` after ``--warmup`` requests; p50 / p99 of the
  per-request round trip measured by the clients, requests per second over all clients, and the
  mean requests per forward on the server.

The overhead ratio is served p50 / in-process p50 (1 client: what the protocol costs; more
clients: what sharing the policy costs each of them, against the throughput batching buys).
Timings on a quiet machine only: note the machine in the JSON.

    python benchmarks/serve_latency.py --out benchmarks/serve_latency.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import time
from pathlib import Path

import numpy as np
import torch

TEMPLATES = {"pi0": "embodied_srpo_pi0_lift", "oft": "embodied_srpo_oft_lift"}


def build(name: str):
    """The ServedPolicy of ``name`` (greedy, CPU) and one client observation (openpi's LIBERO keys)."""
    from vla_rl.serving.inputs import ServedInputs
    from vla_rl.serving.policy import ServedPolicy

    rng = np.random.default_rng(0)
    if name == "mlp":
        from policies.mlp.configuration_mlp import MLPPolicyConfig
        from policies.mlp.modeling_mlp import MLPPolicy

        policy = MLPPolicy(MLPPolicyConfig(obs_dim=15, action_dim=7))
        inputs = ServedInputs(15)
        return ServedPolicy(policy, inputs, name), {"observation/state": rng.normal(size=15).astype(np.float32)}
    from vla_rl.dag.loader import load_template
    from vla_rl.dag.registry import WORKFLOWS
    from vla_rl.serving.policy import simulator_io

    config = load_template(TEMPLATES[name]).config
    inputs, bounds = simulator_io(config)
    policy = WORKFLOWS.get("embodied").standalone_policy(config, None)
    camera, shape = next(iter(inputs.images.items()))
    obs = {"observation/state": rng.normal(size=inputs.state_dim).astype(np.float32),
           "observation/image": rng.integers(0, 255, size=shape, dtype=np.uint8), "prompt": inputs.instruction}
    return ServedPolicy(policy, inputs, name, action_bounds=bounds), obs


def percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000.0
    return {"p50_ms": float(np.percentile(ms, 50)), "p99_ms": float(np.percentile(ms, 99)), "n": int(len(ms))}


def in_process(served, request: dict, seconds: float, warmup: int) -> dict:
    obs = served.inputs.engine_observation(request)
    for _ in range(warmup):
        served.act([obs], False)
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        served.act([obs], False)
        times.append(time.perf_counter() - start)
    return percentiles(times)


def client_process(port: int, request: dict, warmup: int, start_at: float, seconds: float, results) -> None:
    """One robot: connect, warm up, then request back to back from ``start_at`` for ``seconds``."""
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    client = WebsocketClientPolicy("127.0.0.1", port)
    for _ in range(warmup):
        client.infer(request)
    while time.time() < start_at:
        time.sleep(0.001)
    times, end = [], start_at + seconds
    while time.time() < end:
        start = time.perf_counter()
        client.infer(request)
        times.append(time.perf_counter() - start)
    results.put(times)


def served_run(served, request: dict, clients: int, seconds: float, warmup: int, window_ms: float) -> dict:
    from vla_rl.serving.server import PolicyServer, server_thread

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    with server_thread(PolicyServer(served, port=0, batch_window_ms=window_ms)) as server:
        start_at = time.time() + 5.0 + 0.5 * clients  # after every client connected and warmed up
        processes = [context.Process(target=client_process, args=(server.port, request, warmup, start_at, seconds,
                                                                  results)) for _ in range(clients)]
        for process in processes:
            process.start()
        while time.time() < start_at:
            time.sleep(0.01)
        before = dict(server.stats)
        times = [t for _ in processes for t in results.get(timeout=seconds + 120)]
        after = dict(server.stats)
        for process in processes:
            process.join()
    requests = after["requests"] - before["requests"]
    return {**percentiles(times), "requests_per_s": len(times) / seconds,
            "mean_batch": requests / max(after["batches"] - before["batches"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policies", default="mlp,pi0,oft")
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per setting")
    parser.add_argument("--warmup", type=int, default=5, help="requests before measuring")
    parser.add_argument("--batch-window-ms", type=float, default=0.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    rows = []
    for name in args.policies.split(","):
        served, request = build(name)
        alone = in_process(served, request, args.seconds, args.warmup)
        print(f"{name}: in-process p50 {alone['p50_ms']:.2f} ms, p99 {alone['p99_ms']:.2f} ms", flush=True)
        for clients in (int(c) for c in args.clients.split(",")):
            result = served_run(served, request, clients, args.seconds, args.warmup, args.batch_window_ms)
            row = {"policy": name, "clients": clients, "in_process_p50_ms": alone["p50_ms"],
                   "in_process_p99_ms": alone["p99_ms"], **result, "overhead_p50": result["p50_ms"] / alone["p50_ms"]}
            rows.append(row)
            print(f"  {clients:2d} clients: p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms, "
                  f"{row['requests_per_s']:.0f} req/s, mean batch {row['mean_batch']:.1f}, "
                  f"p50 / in-process {row['overhead_p50']:.2f}", flush=True)
    print("\n| policy | clients | in-process p50 ms | served p50 ms | served p99 ms | requests/s | mean batch | "
          "p50 ratio |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['clients']} | {r['in_process_p50_ms']:.2f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} "
              f"| {r['requests_per_s']:.0f} | {r['mean_batch']:.1f} | {r['overhead_p50']:.2f} |")
    if args.out is not None:
        machine = {"cpu": platform.processor() or platform.machine(), "cores": multiprocessing.cpu_count(),
                   "torch": torch.__version__, "torch_threads": 1}
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "machine": machine,
                                        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
