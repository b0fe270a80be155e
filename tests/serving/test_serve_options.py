"""`vla-rl serve` checks its options before it loads the policy (minutes for π0 or OpenVLA): a bad
port, a port in use, an empty host, a bad device or temperature are one line naming the option,
and nothing is loaded."""

from __future__ import annotations

import socket

import pytest

pytest.importorskip("websockets", reason="websockets is not installed (a dependency of vla-rl: pip install -e .)")

import vla_rl.serving.policy as served_policy  # noqa: E402
from vla_rl.cli import main  # noqa: E402


@pytest.fixture
def busy_port():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


@pytest.mark.parametrize("options, message", [
    (["--port", "-5"], "--port must be in [0, 65535], got -5"),
    (["--host", ""], "--host must name an address"),  # bound every interface, on two ports
    (["--host", "not_a_host.invalid"], "--host not_a_host.invalid --port 8000 cannot be bound"),
    (["--batch-window-ms", "-10"], "--batch-window-ms must be >= 0"),
    (["--token", ""], "--token (or VLA_RL_SERVE_TOKEN) must not be empty"),
    (["--temperature", "0"], "--temperature must be a finite number > 0"),
    (["--temperature", "inf"], "--temperature must be a finite number > 0, got inf"),
    (["--device", "tpu"], "--device 'tpu' is not a device"),
])
def test_bad_options_are_refused_before_the_policy_loads(options, message, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(served_policy, "load_served_policy", lambda *a, **k: pytest.fail("the policy was loaded"))
    assert main(["serve", str(tmp_path), *options]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_an_empty_token_from_the_environment_names_the_variable(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(served_policy, "load_served_policy", lambda *a, **k: pytest.fail("the policy was loaded"))
    monkeypatch.setenv("VLA_RL_SERVE_TOKEN", "")
    assert main(["serve", str(tmp_path)]) == 2
    assert "VLA_RL_SERVE_TOKEN" in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_the_policy_loads(busy_port, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(served_policy, "load_served_policy", lambda *a, **k: pytest.fail("the policy was loaded"))
    assert main(["serve", str(tmp_path), "--port", str(busy_port)]) == 2
    assert f"--host 127.0.0.1 --port {busy_port} cannot be bound" in capsys.readouterr().err


def _mlp_export(directory):
    from policies.mlp.modeling_mlp import MLPPolicy, MLPPolicyConfig

    MLPPolicy(MLPPolicyConfig(obs_dim=4, action_dim=2)).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "model.safetensors").write_bytes(b"\x10"), "does not load as an MLP export: ValueError: "
     "{d}/model.safetensors: not a safetensors file (1 bytes, shorter than its 8-byte header length)"),
    (lambda d: (d / "model.safetensors").unlink(), "does not load as an MLP export: FileNotFoundError"),
    (lambda d: (d / "config.json").write_text('{"policy": "mlp", "obs_dim": "x", "action_dim": 2}'),
     "does not load as an MLP export: ValueError: MLPPolicyConfig.obs_dim must be a positive int"),
    (lambda d: [f.unlink() for f in d.iterdir()], "holds no policy: not a run directory (no checkpoints/)"),
    # another version's or a hand-edited config.json: a TypeError traceback before
    (lambda d: (d / "config.json").write_text('{"policy": "mlp", "obs_dim": 4}'),
     "does not load as an MLP export: ValueError: {d}/config.json: lacks ['action_dim']"),
    (lambda d: (d / "config.json").write_text('{"policy": "mlp", "obs_dim": 4, "action_dim": 2, "bogus": 1}'),
     "config.json: fields an MLP policy's configuration does not have: ['bogus']"),
    (lambda d: (d / "config.json").write_text('{"policy": "mlp", "obs_dim": 4, "action_dim": 2, "hidden_sizes": 5}'),
     "ValueError: MLPPolicyConfig.hidden_sizes must be positive ints"),
    (lambda d: [f.unlink() for f in d.iterdir()] + [(d / name).write_text("{}") for name in ("template.yaml",
                                                                                        "metrics.jsonl")],
     "nothing to serve: run {d} has no checkpoint yet (a run writes its first after trainer.save_every steps"),
    # a seed sweep's sweep.json and report.json passed it for an export needing --template
    (lambda d: [f.unlink() for f in d.iterdir()] + [(d / name).write_text("{}") for name in ("sweep.json",
                                                                                        "report.json")],
     "nothing to serve: {d} is a sweep of seeds: name one of its runs, e.g. {d}/seed_<S>"),
])
def test_a_damaged_or_empty_export_is_one_line(damage, message, tmp_path, capsys):
    """A truncated or missing weight file, or a bad config (another version's fields: a
    TypeError), was a traceback; an empty directory was told to add --template; a run that has
    written no checkpoint yet was "not a run directory"."""
    damage(_mlp_export(tmp_path / "export"))
    assert main(["serve", str(tmp_path / "export"), "--port", "0"]) == 2
    err = capsys.readouterr().err
    message = message.format(d=(tmp_path / "export").resolve())
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
