"""``vla-rl serve`` driven by PyPI's ``openpi-client`` (a client nobody here wrote), on loopback:
served actions are the in-process policy's, for an MLP Lift checkpoint and a tiny π0 export;
malformed requests get an error while the server keeps serving; concurrent clients share forwards
without mixing rows; a token keeps strangers out."""

from __future__ import annotations

import concurrent.futures
import logging
import socket
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

# absent on hosts without them (the GPU image has neither): the module is skipped, not a collection error
pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")
pytest.importorskip("openpi_client", reason="openpi-client is not installed (the test extra: pip install -e '.[test]')")
import websockets
from openpi_client.action_chunk_broker import ActionChunkBroker
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from test_export import make_run, write_checkpoint

from vla_rl.cli import main
from vla_rl.dag.registry import WORKFLOWS
from vla_rl.serving import ServeError
from vla_rl.serving.policy import load_served_policy
from vla_rl.serving.server import PolicyServer, server_thread
from vla_rl_core.observations import encode_instruction, to_torch

pytestmark = pytest.mark.usefixtures("torch_one_thread")


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A Lift run directory of the main job with one checkpoint of a non-trivial MLP (random
    weights, state statistics set) and that policy."""
    run_dir, config = make_run(tmp_path_factory.mktemp("serve"), "embodied_srpo", "policy.config.hidden_sizes=[32]")
    policy = WORKFLOWS.get("embodied").standalone_policy(config, run_dir)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in policy.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    policy.set_obs_normalization(torch.randn(15, generator=generator), torch.rand(15, generator=generator) + 0.5)
    write_checkpoint(run_dir, 2, model=policy)
    return run_dir, policy.eval()


@pytest.fixture(scope="module")
def mlp_server(mlp_run):
    with server_thread(PolicyServer(load_served_policy(mlp_run[0], device="cpu"), port=0,
                                    batch_window_ms=20.0)) as server:
        yield server


def states(n: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, 15)).astype(np.float32)


def greedy(policy, obs) -> np.ndarray:
    """The policy's greedy actions in the simulator's units, unclipped."""
    obs = to_torch(obs)
    return policy.env_actions(policy.sample_actions(obs, greedy=True)[0], obs).numpy()


def lift_executed(actions: np.ndarray) -> np.ndarray:
    """Actions as Lift executes them: clipped to its action space, [-1, 1]."""
    return np.clip(actions, -1.0, 1.0)


def test_openpi_client_gets_the_checkpoints_greedy_actions(mlp_run, mlp_server):
    _, policy = mlp_run
    client = WebsocketClientPolicy("127.0.0.1", mlp_server.port)
    metadata = client.get_server_metadata()
    assert metadata["action_horizon"] == 1 and metadata["action_dim"] == 7
    assert metadata["inputs"] == {"state": [15]} and metadata["policy"] == "mlp (run/step_00000002)"
    assert metadata["action_low"] == [-1.0] * 7 and metadata["action_high"] == [1.0] * 7  # Lift's action space
    obs = states(5)
    served = np.stack([client.infer({"state": row})["actions"] for row in obs])
    assert served.dtype == np.float32 and served.shape == (5, 1, 7)
    raw = greedy(policy, obs)
    assert np.abs(raw).max() > 1.5  # this policy's means leave the action space ...
    np.testing.assert_array_equal(served, lift_executed(raw))  # ... and the robot gets what Lift executed
    broker = ActionChunkBroker(client, action_horizon=1)  # openpi's runtime hands out one action at a time
    np.testing.assert_array_equal(broker.infer({"observation/state": obs[0]})["actions"], served[0, 0])


def test_a_malformed_request_gets_an_error_and_the_server_keeps_serving(mlp_run, mlp_server):
    client = WebsocketClientPolicy("127.0.0.1", mlp_server.port)
    with pytest.raises(RuntimeError, match=r"state has shape \(3,\); the policy takes a state of shape \(15,\)"):
        client.infer({"state": np.zeros(3, dtype=np.float32)})
    with pytest.raises(RuntimeError, match="has no state"):
        client.infer({"image": np.zeros((2, 2, 3), dtype=np.uint8)})
    client._ws.send(b"\xc1")  # not msgpack at all
    assert "not a msgpack-numpy message" in client._ws.recv()
    obs = states(1)
    want = lift_executed(greedy(mlp_run[1], obs)[0])
    np.testing.assert_array_equal(client.infer({"state": obs[0]})["actions"], want)
    other = WebsocketClientPolicy("127.0.0.1", mlp_server.port)
    np.testing.assert_array_equal(other.infer({"state": obs[0]})["actions"], want)


def test_concurrent_clients_share_forwards_and_each_gets_its_own_rows(mlp_run, mlp_server):
    obs = states(8 * 6, seed=2).reshape(8, 6, 15)
    want = lift_executed(greedy(mlp_run[1], obs.reshape(-1, 15))).reshape(8, 6, 1, 7)

    def episode(i):
        client = WebsocketClientPolicy("127.0.0.1", mlp_server.port)
        replies = [client.infer({"state": row}) for row in obs[i]]
        return np.stack([r["actions"] for r in replies]), max(r["server_timing"]["batch_size"] for r in replies)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(episode, range(8)))
    for i, (actions, _) in enumerate(results):
        np.testing.assert_array_equal(actions, want[i])  # batch-invariant MLP: batched rows are the single ones
    assert max(size for _, size in results) > 1


def test_sampling_on_request_is_the_policys_seeded_sample(mlp_run):
    run_dir, policy = mlp_run
    obs = states(1)
    generator = torch.Generator().manual_seed(7)
    want = [lift_executed(policy.sample_actions(torch.as_tensor(obs), generator=generator)[0].numpy()[0])
            for _ in range(2)]
    with server_thread(PolicyServer(load_served_policy(run_dir, device="cpu", seed=7), port=0)) as server:
        client = WebsocketClientPolicy("127.0.0.1", server.port)
        got = [client.infer({"state": obs[0], "sample": True})["actions"] for _ in range(2)]
        np.testing.assert_array_equal(np.stack(got), np.stack(want))
        assert not np.array_equal(got[0], lift_executed(greedy(policy, obs)[0]))
        with pytest.raises(RuntimeError, match="'sample' must be true or false, got 'yes'"):
            client.infer({"state": obs[0], "sample": "yes"})
        with pytest.raises(RuntimeError, match=r"'sample' must be true or false, got a list$") as err:
            client.infer({"state": obs[0], "sample": [0.0] * 10**6})  # its repr: 5 MB of reply and log line
        assert len(str(err.value)) < 200


def test_a_token_keeps_out_clients_without_it(mlp_run, caplog):
    served = load_served_policy(mlp_run[0], device="cpu")
    with server_thread(PolicyServer(served, port=0, token="s3cret")) as server:
        for key in (None, "wrong"):
            with pytest.raises(websockets.InvalidStatus, match="401"):
                WebsocketClientPolicy("127.0.0.1", server.port, api_key=key)
        assert WebsocketClientPolicy("127.0.0.1", server.port, api_key="s3cret").infer(
            {"state": states(1)[0]})["actions"].shape == (1, 7)
        with caplog.at_level(logging.INFO, logger="websockets.server"):
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz") as reply:
                assert reply.status == 200
            deadline = time.monotonic() + 10  # logged on the server's thread
            while "a health check" not in caplog.text and time.monotonic() < deadline:
                time.sleep(0.05)
        # it was logged as "connection rejected (200 OK)"
        assert "answered an HTTP request (200 OK): a health check" in caplog.text
        assert "connection rejected (200" not in caplog.text
        # a token that is not UTF-8: refused as any wrong one (it was a 500 and a traceback)
        with socket.create_connection(("127.0.0.1", server.port)) as raw:
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                        b"Authorization: Api-Key \xff\xfe\r\n\r\n")
            assert raw.recv(300).split(b"\r\n")[0] == b"HTTP/1.1 401 Unauthorized"
    assert "refused a connection from 127.0.0.1" in caplog.text and "wrong token" in caplog.text


def test_a_tiny_pi0_export_is_served_with_its_template(tmp_path):
    """π0's own processor reads openpi's LIBERO-style keys; the chunk is the in-process greedy one."""
    from vla_rl.dag.loader import load_template
    from vla_rl.serving.policy import simulator_io

    config = load_template("embodied_srpo_pi0_lift").config
    inputs, bounds = simulator_io(config)
    assert dict(inputs.images) == {"agentview": (128, 128, 3)} and inputs.instruction == "lift the cube"
    policy = WORKFLOWS.get("embodied").standalone_policy(config, None)
    rng = np.random.default_rng(0)
    obs = {"state": rng.normal(size=(3, 15)).astype(np.float32),
           "agentview_image": rng.integers(0, 255, size=(3, 128, 128, 3), dtype=np.uint8),
           "instruction": np.stack([encode_instruction("lift the cube")] * 3)}
    policy.fit_observation_normalization(to_torch(obs))
    policy.save_pretrained(tmp_path / "pi0")
    served = load_served_policy(tmp_path / "pi0", "embodied_srpo_pi0_lift", device="cpu")
    with server_thread(PolicyServer(served, port=0)) as server:
        client = WebsocketClientPolicy("127.0.0.1", server.port)
        assert client.get_server_metadata()["action_horizon"] == 8
        got = np.stack([client.infer({"observation/state": obs["state"][i], "observation/image":
                                      obs["agentview_image"][i], "prompt": "lift the cube"})["actions"]
                        for i in range(3)])
    want = lift_executed(np.stack([greedy(policy.eval(), {key: value[i : i + 1] for key, value in obs.items()})[0]
                                   for i in range(3)]))
    assert got.shape == (3, 8, 7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_serve_errors_are_one_line(mlp_run, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", str(mlp_run[0] / "template.yaml")]) == 2
    assert "template.yaml is a file: name a run directory" in capsys.readouterr().err
    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text('{"architectures": ["OpenVLAForActionPrediction"]}')
    assert main(["serve", str(tmp_path / "export")]) == 2
    assert "add --template TEMPLATE" in " ".join(capsys.readouterr().err.split())
    assert main(["serve", str(tmp_path / "export"), "--template", "embodied_srpo"]) == 2  # the MLP main job's
    assert "template embodied_srpo trains an MLP policy, and" in capsys.readouterr().err
    assert main(["serve", str(tmp_path / "export"), "--template", "llm_grpo"]) == 2
    assert "template llm_grpo trains a text policy" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse's own refusal (exit 2): torch's generators take no such seed
        main(["serve", str(mlp_run[0]), "--seed", str(2**64)])
    assert "argument --seed: a seed is in [0, 4294967295], got 18446744073709551616" in capsys.readouterr().err
    assert main(["serve", str(mlp_run[0]), "policy.config.hidden_sizes=[8]"]) == 2
    assert "give the training settings of a π0/OpenVLA export" in " ".join(capsys.readouterr().err.split())
    # a run (and an MLP export) records its own settings: a --template was ignored, silently
    assert main(["serve", str(mlp_run[0]), "--template", "embodied_srpo_pi0_lift"]) == 2
    assert "--template embodied_srpo_pi0_lift: --template and its overrides give the training settings" in " ".join(
        capsys.readouterr().err.split())
    served = load_served_policy(mlp_run[0], device="cpu")
    with server_thread(PolicyServer(served, port=0)) as server:
        with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{server.port}"):
            with server_thread(PolicyServer(served, port=server.port)):
                pass
    with pytest.raises(ServeError, match="no such CUDA device|is not a device"):
        load_served_policy(mlp_run[0], device="cuda:7" if torch.cuda.device_count() < 8 else "nodevice")


def test_a_text_run_is_refused_before_its_model_loads(tmp_path, tiny_lm_dir, capsys):
    """Its run directory or checkpoint loaded the language model, then ended in a traceback
    (AttributeError: no action_dim)."""
    import shutil

    base = Path(shutil.copytree(tiny_lm_dir, tmp_path / "base"))
    run_dir, config = make_run(tmp_path, "llm_grpo", f"text.model_path={base}")
    checkpoint = write_checkpoint(run_dir, 1, model=WORKFLOWS.get("text").standalone_policy(config, run_dir))
    shutil.rmtree(base)  # loading the model would now fail: the refusal comes first
    capsys.readouterr()
    for target in (run_dir, checkpoint):
        assert main(["serve", str(target)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == f"error: {checkpoint} is a checkpoint of a text run; vla-rl serve serves robot policies"
