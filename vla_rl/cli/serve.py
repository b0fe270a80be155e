"""``vla-rl serve`` (a policy over openpi's websocket protocol) and ``vla-rl remote-env``
(simulator environments for a run on another machine)."""

from __future__ import annotations

import argparse

from vla_rl.cli.arguments import positive_int, seed_value
from vla_rl.errors import CommandLineError, RunStopped
from vla_rl.serving import DEFAULT_MAX_MESSAGE_MB


def add_serve_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "serve",
        help="serve a trained policy to robots over openpi's websocket protocol (openpi-client drives it)",
        description="Load a policy (a run directory's newest checkpoint, a checkpoint directory, or an export of "
        "vla-rl export) and serve it over openpi's websocket protocol: metadata on connect, an observation dict "
        "in, an action chunk out (greedy unless --sample or a request's 'sample': true). Concurrent clients share "
        "forwards. Binds 127.0.0.1 unless --host says otherwise. README, 'Real robots'.",
    )
    parser.add_argument("target", metavar="CHECKPOINT_OR_EXPORT",
                        help="a run directory, a checkpoint directory (<run>/checkpoints/step_*) or an export")
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="dotted overrides of --template (the training settings of a π0/OpenVLA export)")
    parser.add_argument("--template", default=None, metavar="TEMPLATE",
                        help="the template a π0/OpenVLA(-OFT) export was trained with (checkpoints record their own)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1, loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    parser.add_argument("--token", default=None,
                        help="shared secret clients must send (Authorization: Api-Key TOKEN; openpi-client's "
                        "api_key); also read from VLA_RL_SERVE_TOKEN")
    parser.add_argument("--device", default=None, help="cpu, cuda, cuda:1, ... (default: cuda if present, else cpu)")
    parser.add_argument("--sample", action="store_true", help="sample actions by default instead of the mode")
    parser.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (default 1.0)")
    parser.add_argument("--seed", type=seed_value, default=0, help="seed of the sampled actions (default 0)")
    parser.add_argument("--batch-window-ms", type=float, default=0.0,
                        help="how long a batch waits for more requests after its first (default 0)")
    parser.add_argument("--max-batch", type=positive_int, default=64, help="most requests per forward (default 64)")
    parser.add_argument("--max-message-mb", type=float, default=DEFAULT_MAX_MESSAGE_MB, metavar="MIB",
                        help="largest request, MiB; a larger one closes its connection (default "
                        f"{DEFAULT_MAX_MESSAGE_MB:g})")
    parser.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    import logging
    import math
    import os

    from vla_rl.serving import ServeError
    from vla_rl.serving.policy import load_served_policy, resolve_device
    from vla_rl.serving.server import PolicyServer, check_settings

    token = args.token if args.token is not None else os.environ.get("VLA_RL_SERVE_TOKEN")
    # the options first: loading a large policy takes minutes
    check_settings(args.host, args.port, token, args.batch_window_ms, args.max_batch, probe_port=True,
                   max_message_mb=args.max_message_mb)
    resolve_device(args.device)
    if not (math.isfinite(args.temperature) and args.temperature > 0):
        raise ServeError(f"--temperature must be a finite number > 0, got {args.temperature}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    served = load_served_policy(args.target, args.template, args.overrides, device=args.device,
                                temperature=args.temperature, seed=args.seed)
    server = PolicyServer(served, host=args.host, port=args.port, token=token, sample=args.sample,
                          batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                          max_message_mb=args.max_message_mb)
    server.serve_forever()
    return 0


def add_remote_env_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "remote-env",
        help="run environments of a simulator for a run on another machine (simulator.name: remote)",
        description="Create --num-envs environments of SIMULATOR (its config from KEY=VALUE, e.g. horizon=100) "
        "and connect each to a run's remote environment hub (vla_rl.remote.RobotClient, one thread each) until "
        "Ctrl-C; a dropped connection is made again. docs/remote.md.",
    )
    parser.add_argument("simulator", help="a registered simulator, e.g. robosuite_lift")
    parser.add_argument("overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="the simulator's config fields (YAML values)")
    parser.add_argument("--connect", default="ws://127.0.0.1:8765", metavar="URI",
                        help="the hub: ws://HOST:PORT of the run's simulator.env (default ws://127.0.0.1:8765)")
    parser.add_argument("--num-envs", type=positive_int, default=1, help="environments (connections), default 1")
    parser.add_argument("--token", default=None, help="the run's token; also read from VLA_RL_REMOTE_TOKEN")
    parser.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                        help="import MODULE first (repeatable): a plug-in that registers SIMULATOR, as a run's "
                        "run.imports does (docs/extending.md)")
    parser.set_defaults(handler=run_remote_env)


def _check_hub_address(uri: str) -> None:
    """``--connect``: a ws:// or wss:// URI whose host resolves (a hub not up yet is waited for; a
    name that does not resolve is a typo, which would otherwise be retried forever).

    Raises:
        CommandLineError: naming the option, the URI and why.
    """
    import socket

    from websockets.exceptions import InvalidURI
    from websockets.uri import parse_uri

    try:
        parsed = parse_uri(uri)
    except (InvalidURI, ValueError) as err:  # ValueError: urllib's port out of range
        raise CommandLineError(f"--connect {uri}: {err} (the run's hub is ws://HOST:PORT)") from None
    try:
        socket.getaddrinfo(parsed.host, parsed.port, type=socket.SOCK_STREAM)
    except socket.gaierror as err:
        raise CommandLineError(f"--connect {uri}: host {parsed.host!r} does not resolve ({err.strerror})") from None


def run_remote_env(args: argparse.Namespace) -> int:
    import importlib
    import logging
    import os
    import threading

    import gymnasium as gym
    import yaml

    from simulators import SIMULATORS, make_env
    from vla_rl.dag.loader import not_on_path
    from vla_rl.remote import RemoteRefused, serve_envs

    _check_hub_address(args.connect)  # before the environments: a robosuite one takes seconds to make
    for module in args.imports:
        try:
            importlib.import_module(module)
        except Exception as exc:  # any failure of the user's module is reported in one line
            raise CommandLineError(f"--import {module}: cannot import it: {type(exc).__name__}: {exc}"
                                   f"{not_on_path(module, exc)}") from None
    # vla-rl's own INFO lines (connections, episodes lost); other packages' warnings only (PyOpenGL's INFO)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("vla_rl").setLevel(logging.INFO)
    fields = {}
    for item in args.overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CommandLineError(f"{item!r}: simulator config fields are KEY=VALUE")
        fields[key] = yaml.safe_load(value)
    simulator = SIMULATORS.get(args.simulator)
    if not (isinstance(simulator, type) and issubclass(simulator, gym.Env)):
        raise CommandLineError(f"{args.simulator}: a batched simulator ({getattr(simulator, '__name__', simulator)} "
                               "steps all its environments at once); vla-rl remote-env serves gymnasium Env "
                               "simulators, one environment per connection")
    try:
        envs = [make_env(args.simulator, fields) for _ in range(args.num_envs)]
    except (ValueError, TypeError) as err:
        raise CommandLineError(f"{args.simulator}: {err}") from None
    stop = threading.Event()
    token = args.token if args.token is not None else os.environ.get("VLA_RL_REMOTE_TOKEN")
    clients = serve_envs(envs, args.connect, token, stop)
    try:
        while all(client.thread.is_alive() for client in clients):
            clients[0].thread.join(0.5)
    finally:
        stop.set()
        for client in clients:
            client.thread.join(5.0)
        for env in envs:
            env.close()
    errors = [client.error for client in clients if client.error is not None]
    if errors and isinstance(errors[0], RemoteRefused):  # the token or the environments: the user's input
        raise CommandLineError(str(errors[0]))
    if errors:
        raise RunStopped(str(errors[0]))
    return 0
