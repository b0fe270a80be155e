"""``vla-rl serve`` per request, with a tiny in-process MLP (no run directory): values that are not
finite in float32 never reach the policy and non-finite actions never reach the robot; malformed
messages and unexpected failures are one text line while the connection keeps serving; the reply's
timing fields are openpi's; a server object runs again after it stopped."""

from __future__ import annotations

import dataclasses
import logging

import msgpack
import numpy as np
import pytest
import torch

# absent on hosts without them (the GPU image has neither): the module is skipped, not a collection error
pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")
pytest.importorskip("openpi_client", reason="openpi-client is not installed (the test extra: pip install -e '.[test]')")
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from policies.mlp.configuration_mlp import MLPPolicyConfig
from policies.mlp.modeling_mlp import MLPPolicy
from vla_rl.serving import ServeError
from vla_rl.serving.inputs import ServedInputs
from vla_rl.serving.policy import ServedPolicy
from vla_rl.serving.server import PolicyServer, server_thread

pytestmark = pytest.mark.usefixtures("torch_one_thread")

OBS_DIM, ACT_DIM = 15, 7


@dataclasses.dataclass(frozen=True)
class BuggyInputs(ServedInputs):
    """Inputs whose reading fails with a KeyError (a bug, not a client's mistake) on ``{"bug": 1}``."""

    def engine_observation(self, request):
        if isinstance(request, dict) and "bug" in request:
            raise KeyError("a bug in reading the request")
        return super().engine_observation(request)


def served(inputs: ServedInputs | None = None) -> ServedPolicy:
    torch.manual_seed(0)
    policy = MLPPolicy(MLPPolicyConfig(obs_dim=OBS_DIM, action_dim=ACT_DIM, hidden_sizes=(32,)))
    return ServedPolicy(policy, inputs or ServedInputs(OBS_DIM), "tiny-mlp")


@pytest.fixture(scope="module")
def server():
    with server_thread(PolicyServer(served(BuggyInputs(OBS_DIM)), port=0)) as running:
        yield running


def state(seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=OBS_DIM).astype(np.float32)


def test_a_state_beyond_float32_is_refused_naming_the_field(server):
    """1e39 is finite in float64 but inf in the float32 the policy takes: it gave NaN actions."""
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    big = state().astype(np.float64)
    big[:2] = [1e39, -1e39]
    with pytest.raises(RuntimeError, match="observation/state holds non-finite values"):
        client.infer({"observation/state": big})
    assert np.isfinite(client.infer({"state": state()})["actions"]).all()  # the connection still serves


def test_non_finite_actions_are_an_error_line_not_sent():
    policy = served()
    act = policy.act

    def act_nan_on_marked_rows(observations, sample):  # a policy that overflows on some inputs
        actions = act(observations, sample)
        actions[[obs[0] == 99.0 for obs in observations]] = np.nan
        return actions

    policy.act = act_nan_on_marked_rows
    with server_thread(PolicyServer(policy, port=0)) as running:
        client = WebsocketClientPolicy("127.0.0.1", running.port)
        marked = state()
        marked[0] = 99.0
        with pytest.raises(RuntimeError, match="the policy's actions for this request hold non-finite values"):
            client.infer({"state": marked})
        assert np.isfinite(client.infer({"state": state()})["actions"]).all()
        assert running.stats["errors"] == 1


def test_actions_are_clipped_to_the_training_action_space_and_non_finite_ones_stay_errors():
    """A robot got a gripper command of 4.58 from a Lift policy (whose simulator executed 1.0): the
    served actions are clipped to the bounds the server was given, per dimension, and a NaN is not
    clipped into a bound (the server refuses it)."""
    low, high = np.full(ACT_DIM, -0.5, np.float32), np.linspace(0.1, 0.7, ACT_DIM, dtype=np.float32)
    bounded = ServedPolicy(served().policy, ServedInputs(OBS_DIM), "tiny-mlp", action_bounds=(low, high))
    raw = served().act([100 * state(seed) for seed in range(4)], sample=False)  # no bounds: as the policy gives
    assert (raw < low).any() and (raw > high).any()
    np.testing.assert_array_equal(bounded.act([100 * state(seed) for seed in range(4)], sample=False),
                                  np.clip(raw, low, high))
    assert bounded.metadata()["action_low"] == low.tolist() and bounded.metadata()["action_high"] == high.tolist()
    assert served().metadata()["action_low"] is None
    act = bounded.policy.env_actions

    for value in (float("nan"), float("inf"), -float("inf")):  # inf was clipped into a bound and sent
        def non_finite(actions, obs, value=value):
            return torch.full_like(act(actions, obs), value)

        bounded.policy.env_actions = non_finite
        with server_thread(PolicyServer(bounded, port=0)) as running:
            with pytest.raises(RuntimeError, match="hold non-finite values"):
                WebsocketClientPolicy("127.0.0.1", running.port).infer({"state": state()})
    with pytest.raises(ServeError, match=r"the action bounds have shapes \[\(3,\), \(3,\)\]; the policy's actions "
                                         r"have 7 values"):
        ServedPolicy(served().policy, ServedInputs(OBS_DIM), "tiny-mlp", action_bounds=(np.zeros(3), np.ones(3)))


def test_a_remote_runs_actions_are_served_unclipped():
    """A remote environment's action space is the trainer's placeholder [-1, 1]; the robot clipped
    to its own bounds, which it does not send: serving clipped to [-1, 1] what a robot of
    Box(-10, 10) executed unclipped in training."""
    from vla_rl.dag.loader import load_template
    from vla_rl.serving.policy import simulator_io

    remote = load_template("embodied_srpo", ["simulator.name=remote", "simulator.env.state_dim=15",
                                             "simulator.env.action_dim=7", "warm_start.num_demos=0"]).config
    inputs, bounds = simulator_io(remote)
    assert bounds is None and inputs.state_dim == 15


@pytest.mark.parametrize("array, field", [
    ({b"__ndarray__": True, b"data": b"\0" * 60, b"dtype": "<f4"}, "shape"),
    ({b"__ndarray__": True, b"data": b"\0" * 60, b"shape": [15]}, "dtype"),
    ({b"__npgeneric__": True, b"data": 1.0}, "dtype"),
], ids=["no-shape", "no-dtype", "scalar-no-dtype"])
def test_a_malformed_array_map_is_one_line_naming_the_field(server, array, field):
    """Such a message raised KeyError out of unpackb: the connection closed with 1011, no text."""
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    client._ws.send(msgpack.packb({"state": array}))
    reply = client._ws.recv(timeout=10)
    assert isinstance(reply, str) and "not a msgpack-numpy message" in reply and f"'{field}'" in reply
    assert "\n" not in reply
    assert client.infer({"state": state()})["actions"].shape == (1, ACT_DIM)


def test_an_unexpected_failure_on_a_request_is_one_line_and_the_connection_serves(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    with pytest.raises(RuntimeError, match="could not serve this request: KeyError: 'a bug in reading the request'"):
        client.infer({"state": state(), "bug": 1})
    assert client.infer({"state": state()})["actions"].shape == (1, ACT_DIM)


def test_replies_carry_openpis_timing_fields(server):
    """``policy_timing.infer_ms``, and ``server_timing.prev_total_ms`` from a connection's second
    reply on (openpi's WebsocketPolicyServer and Policy), besides vla-rl's own fields."""
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    first, second = client.infer({"state": state()}), client.infer({"state": state(2)})
    assert set(first["server_timing"]) == {"infer_ms", "batch_size", "total_ms"}
    assert set(second["server_timing"]) == {"infer_ms", "batch_size", "total_ms", "prev_total_ms"}
    assert second["server_timing"]["prev_total_ms"] >= first["server_timing"]["total_ms"] > 0  # it adds the send
    for reply in (first, second):
        assert set(reply["policy_timing"]) == {"infer_ms"}
        assert 0 < reply["policy_timing"]["infer_ms"] <= reply["server_timing"]["infer_ms"]
    other = WebsocketClientPolicy("127.0.0.1", server.port)  # per connection: a new one starts afresh
    assert "prev_total_ms" not in other.infer({"state": state()})["server_timing"]


def test_a_server_runs_again_after_it_stopped():
    """Its thread pool was shut down at the end of a run and made only once: every request of the
    second run failed."""
    running = PolicyServer(served(), port=0)
    for _ in range(2):
        with server_thread(running):
            assert WebsocketClientPolicy("127.0.0.1", running.port).infer({"state": state()})["actions"].shape == \
                (1, ACT_DIM)


def test_a_tcp_probe_is_one_log_line_not_a_traceback(server, caplog):
    """A TCP health check (connects, sends nothing, closes) logged websockets' ERROR "opening
    handshake failed" with a 30-line chained traceback; 50 probes gave 150 tracebacks."""
    import logging
    import socket
    import time
    import urllib.error
    import urllib.request

    with caplog.at_level(logging.INFO):
        for _ in range(3):
            socket.create_connection(("127.0.0.1", server.port)).close()
        with pytest.raises(urllib.error.HTTPError):  # a plain HTTP check (curl, an httpGet probe): no upgrade
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/", timeout=10)
        deadline = time.monotonic() + 10
        while caplog.text.count("opening handshake failed") < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    failures = [r for r in caplog.records if r.getMessage().startswith("opening handshake failed")]
    assert len(failures) == 4
    assert all(r.levelno == logging.INFO and r.exc_info is None and "\n" not in r.getMessage() for r in failures)
    assert "Traceback" not in caplog.text
    assert WebsocketClientPolicy("127.0.0.1", server.port).infer({"state": state()})["actions"].shape == (1, ACT_DIM)


def test_a_bug_in_the_request_handler_keeps_its_error_and_traceback(caplog, monkeypatch):
    """Only a peer's leaving is shortened: an exception of the server's own handshake code is an
    ERROR with its traceback, as websockets logs it."""
    import logging
    import time

    def broken(self, connection, request):
        raise KeyError("a bug in the token check")

    monkeypatch.setattr(PolicyServer, "_process_request", broken)
    with server_thread(PolicyServer(served(), port=0)) as running, caplog.at_level(logging.INFO):
        with pytest.raises(Exception):
            WebsocketClientPolicy("127.0.0.1", running.port)
        deadline = time.monotonic() + 10
        while "opening handshake failed" not in caplog.text and time.monotonic() < deadline:
            time.sleep(0.05)
    (failure,) = [r for r in caplog.records if r.getMessage().startswith("opening handshake failed")]
    assert failure.levelno == logging.ERROR and failure.exc_info is not None


def test_a_message_over_the_limit_closes_its_connection_and_the_server_serves_on(caplog):
    """openpi's server takes any size (``max_size=None``): an audit sent 300 MB and the server held
    it. Now a message over ``--max-message-mb`` closes its connection (code 1009), logged naming
    the limit; other connections are served."""
    import websockets
    from websockets.sync.client import connect

    from vla_rl_core import wire

    with server_thread(PolicyServer(served(), port=0, max_message_mb=0.01)) as running, \
            caplog.at_level(logging.WARNING, logger="vla_rl.serving.server"):
        with connect(f"ws://127.0.0.1:{running.port}", max_size=None) as big:
            big.recv()  # the metadata
            big.send(wire.packb({"observation/state": np.zeros(4096, np.float32)}))  # 16 KiB > 10.24 KiB
            with pytest.raises(websockets.ConnectionClosedError) as closed:
                big.recv()
        assert closed.value.rcvd.code == 1009
        client = WebsocketClientPolicy("127.0.0.1", running.port)
        assert client.infer({"observation/state": state()})["actions"].shape[-1] == ACT_DIM
    assert any("larger than --max-message-mb 0.01 MiB" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize("limit", [0.0, -1.0, float("nan"), float("inf")])
def test_a_message_limit_that_is_not_a_positive_size_is_refused(limit):
    with pytest.raises(ServeError, match="--max-message-mb must be a finite number > 0"):
        PolicyServer(served(), port=0, max_message_mb=limit)


@pytest.mark.parametrize("window_ms, max_batch, message", [
    (float("nan"), 64, "--batch-window-ms must be >= 0, got nan"),
    (0.0, 0, "--max-batch must be >= 1, got 0"),
])
def test_a_batch_window_that_is_not_a_number_or_an_empty_batch_is_refused(window_ms, max_batch, message):
    with pytest.raises(ServeError, match=message):
        PolicyServer(served(), port=0, batch_window_ms=window_ms, max_batch=max_batch)


def test_a_sample_field_that_is_not_a_boolean_is_refused(server):
    client = WebsocketClientPolicy("127.0.0.1", server.port)
    with pytest.raises(RuntimeError, match="'sample' must be true or false, got 1"):
        client.infer({"state": state(), "sample": 1})
    assert client.infer({"state": state(), "sample": np.bool_(False)})["actions"].shape == (1, ACT_DIM)


def test_the_message_limit_is_in_mebibytes():
    """0.01 MiB is 10485 bytes: a message of about 10.2 kB is read (and refused for its shape, in
    a text reply), not cut off as over the limit."""
    from websockets.sync.client import connect

    from vla_rl_core import wire

    message = wire.packb({"state": np.zeros(2530, np.float32)})
    assert 10_000 < len(message) < 0.01 * 2**20
    with server_thread(PolicyServer(served(), port=0, max_message_mb=0.01)) as running:
        with connect(f"ws://127.0.0.1:{running.port}", max_size=None) as client:
            client.recv()  # the metadata
            client.send(message)
            assert "state has shape (2530,)" in client.recv(timeout=30)


def test_a_server_bound_beyond_loopback_warns_when_no_token_is_required(caplog):
    with caplog.at_level(logging.WARNING, logger="vla_rl.serving.server"):
        PolicyServer(served(), host="0.0.0.0", port=0)._log_start()
        PolicyServer(served(), host="0.0.0.0", port=0, token="s3cret")._log_start()
        PolicyServer(served(), host="127.0.0.1", port=0)._log_start()
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "bound to 0.0.0.0, not loopback: other machines can reach this policy server and no token is required "
        "(add --token)", "bound to 0.0.0.0, not loopback: other machines can reach this policy server"]


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_a_served_temperature_that_is_not_positive_is_refused(temperature):
    with pytest.raises(ServeError, match="--temperature must be > 0"):
        ServedPolicy(served().policy, ServedInputs(OBS_DIM), "tiny-mlp", temperature=temperature)


def test_sampled_actions_are_the_policys_draw_at_the_served_temperature_and_seed():
    policy = served(ServedInputs(OBS_DIM)).policy
    observations = np.stack([state(1), state(2)])
    expected = policy.sample_actions(torch.as_tensor(observations), greedy=False,
                                     generator=torch.Generator().manual_seed(3), temperature=0.25)[0]
    expected = policy.env_actions(expected, torch.as_tensor(observations)).numpy()
    sampling = ServedPolicy(policy, ServedInputs(OBS_DIM), "tiny-mlp", temperature=0.25, seed=3)
    np.testing.assert_allclose(sampling.act(list(observations), sample=True), expected, rtol=1e-6)
