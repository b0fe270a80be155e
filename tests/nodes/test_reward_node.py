"""The reward node on camera observations: which observations each SRPO trajectory encoder
reads, the encoders a worker builds from the config (state, the policy's vision backbone,
V-JEPA 2 from a local directory), and the whole-step reference set gathered across shards."""

from __future__ import annotations

import os
import types
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawned import run_workers
from tensordict import TensorDict

from vla_rl.config import RunConfig
from vla_rl.nodes.reward import episode_rewards, step_reference, trajectory_embeddings
from vla_rl.rewards.trajectory_encoders import encode_state_trajectories
from vla_rl.workers.resources import Resources
from vla_rl_core import keys
from vla_rl_core.env_spec import EnvSpec

N, T, STATE_DIM, SIZE = 6, 5, 3, 8


def camera_batch(seed: int = 0) -> TensorDict:
    """Six episodes of camera observations: 3 successes, 3 failures, one task."""
    generator = torch.Generator().manual_seed(seed)
    obs = TensorDict({
        keys.OBS_STATE: torch.randn(N, T + 1, STATE_DIM, generator=generator),
        "agentview_image": torch.randint(0, 256, (N, T + 1, SIZE, SIZE, 3), generator=generator, dtype=torch.uint8),
    }, batch_size=[N, T + 1])
    return TensorDict({
        keys.OBS: obs,
        keys.SUCCESS: torch.tensor([True, False, True, False, True, False]),
        keys.TASK_ID: torch.zeros(N, dtype=torch.int64),
        keys.FINISH_STEP: torch.tensor([5, 3, 4, 5, 2, 1]),
        keys.RESPONSE_MASK: torch.ones(N, T, dtype=torch.bool),
    }, batch_size=[N])


def algorithm(**fields):
    return RunConfig.model_validate({"algorithm": fields}).algorithm


def test_state_encoder_reads_the_state_of_camera_observations():
    batch = camera_batch()
    embeddings = trajectory_embeddings(algorithm(state_resample={"points": 4}), batch, encode_state_trajectories)
    expected = encode_state_trajectories(batch[keys.OBS][keys.OBS_STATE], batch[keys.FINISH_STEP] + 1, 4)
    torch.testing.assert_close(embeddings, expected)


class MeanPixel:
    """A frame encoder: each frame's mean pixel value, ``num_points`` frames concatenated."""

    reads_frames = True

    def __call__(self, frames, lengths, num_points):
        self.frames = frames
        steps = torch.stack([torch.linspace(0, int(n) - 1, num_points).floor().long() for n in lengths])
        return frames.float().mean(dim=(2, 3, 4)).gather(1, steps)


def test_frame_encoders_read_the_configured_camera():
    batch = camera_batch()
    encoder = MeanPixel()
    embeddings = trajectory_embeddings(algorithm(trajectory_encoder="policy_backbone", policy_backbone={"points": 3}),
                                       batch, encoder)
    assert torch.equal(encoder.frames, batch[keys.OBS]["agentview_image"])
    assert embeddings.shape == (N, 3)
    with pytest.raises(ValueError, match="wrist_image"):
        trajectory_embeddings(algorithm(trajectory_encoder="policy_backbone", policy_backbone={"camera": "wrist"}),
                              batch, encoder)
    flat = camera_batch()
    flat.set(keys.OBS, torch.zeros(N, T + 1, STATE_DIM))
    with pytest.raises(ValueError, match="flat state"):
        trajectory_embeddings(algorithm(trajectory_encoder="policy_backbone"), flat, encoder)


def resources(tmp_path: Path, policy_name: str, policy_config: dict, **algo) -> Resources:
    """A worker's resources with its ``trajectory_encoder`` built (and the policy it needs)."""
    config = RunConfig.model_validate({"policy": {"name": policy_name, "config": policy_config}, "algorithm": algo,
                                       "simulator": {"env": {"cameras": ["agentview"]}}})  # what the spec below has
    res = Resources(config, rank=0, world_size=1, run_dir=tmp_path, device=torch.device("cpu"), rollout_dp_size=1)
    res.provide("env_spec", EnvSpec(obs_dim=STATE_DIM, action_dim=7, horizon=10,
                             images={"agentview_image": [SIZE, SIZE, 3]}))  # no simulator needed
    res.ensure(["trajectory_encoder"])
    return res


def test_worker_builds_the_policy_backbone_encoder(tmp_path, torch_one_thread):
    res = resources(tmp_path, "openvla_oft", {"architecture": {"preset": "tiny", "fused": False}, "chunk_size": 2},
                    trajectory_encoder="policy_backbone", policy_backbone={"points": 3})
    batch = camera_batch()
    embeddings = trajectory_embeddings(res.config.algorithm, batch, res.trajectory_encoder)
    width = res.policy.vla.vision_backbone.embed_dim
    assert embeddings.shape == (N, 3 * width)
    # Episode 4 lasts 2 decisions: frames 0, 1 and 2 (terminal) of its camera, through the backbone.
    frames = batch[keys.OBS]["agentview_image"][4, [0, 1, 2]]
    torch.testing.assert_close(embeddings[4], res.policy.frame_features(frames).flatten())
    rewards, _ = episode_rewards(res.config.algorithm, batch, res.trajectory_encoder)
    assert rewards[batch[keys.SUCCESS]].eq(1.0).all() and (rewards[~batch[keys.SUCCESS]] < 1.0).all()


def test_policy_backbone_needs_a_vision_policy(tmp_path):
    with pytest.raises(ValueError, match="vision backbone"):
        resources(tmp_path, "mlp", {"hidden_sizes": [4]}, trajectory_encoder="policy_backbone")


def test_worker_builds_vjepa2_from_a_local_directory(tmp_path, tiny_vjepa2_dir, torch_one_thread):
    res = resources(tmp_path, "mlp", {"hidden_sizes": [4]}, trajectory_encoder="vjepa2",
                    vjepa2={"model_dir": str(tiny_vjepa2_dir), "batch_size": 4, "points": 4})
    batch = camera_batch()
    embeddings = trajectory_embeddings(res.config.algorithm, batch, res.trajectory_encoder)
    assert embeddings.shape == (N, 32)  # the tiny model's hidden size: mean-pooled tokens
    assert res.trajectory_encoder.batch_size == 4


def _shard_rewards(rank: int, world: int, store_path: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s SRPO rewards of its half of the step (DP 2), with the step as the reference."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    algo = algorithm(state_resample={"points": 3})
    whole = step_batch()
    shard = whole[rank * 6:(rank + 1) * 6]
    ctx = types.SimpleNamespace(world_size=world, dp_size=world, dp_rank=rank, group=None)
    rewards = (episode_rewards(algo, shard, encode_state_trajectories, step_reference(ctx))[0],
               episode_rewards(algo, shard, encode_state_trajectories)[0])
    dist.destroy_process_group()
    return rewards


def step_batch() -> TensorDict:
    """Twelve episodes of two tasks; the second half of the step holds one success of task 0 only."""
    batch = torch.cat([camera_batch(seed=3), camera_batch(seed=4)])
    batch[keys.SUCCESS] = torch.tensor([1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0], dtype=torch.bool)
    batch[keys.TASK_ID] = torch.tensor([0, 0, 1, 1, 1, 0, 0, 1, 0, 0, 1, 1])
    return batch


def test_step_reference_scores_each_shard_exactly_as_the_whole_step(tmp_path):
    """Two reward shards (DP 2 on 2 workers) that exchange only their successes' embeddings and
    each task's distance span give bit for bit the rewards of the whole step scored at once."""
    results = run_workers(_shard_rewards, 2, str(tmp_path / "store"), nprocs=2)
    whole = step_batch()
    expected, _ = episode_rewards(algorithm(state_resample={"points": 3}), whole, encode_state_trajectories)
    sharded = torch.cat([results[0][0], results[1][0]])
    assert torch.equal(sharded, expected)
    local = torch.cat([results[0][1], results[1][1]])  # each shard its own reference: differs
    assert not torch.equal(local, expected)
    assert expected[whole[keys.SUCCESS]].eq(1.0).all()


def test_an_encoder_reading_a_vision_backbone_the_policy_lacks_is_refused_at_plan_time(capsys):
    """``policy_backbone`` with the MLP: one line at plan time naming the field (the workers raised
    it at their first step, a Ray traceback); a policy with a vision backbone plans."""
    from vla_rl.cli import main

    assert main(["plan", "embodied_srpo", "algorithm.trajectory_encoder=policy_backbone"]) == 2
    err = capsys.readouterr().err
    assert ("node 'reward': field 'algorithm.trajectory_encoder': 'policy_backbone' embeds episodes with the "
            "policy's vision backbone (frame_features); policy 'mlp' has none") in err
    assert main(["plan", "embodied_srpo_oft_lift", "algorithm.trajectory_encoder=policy_backbone"]) == 0


def test_a_vjepa2_directory_without_its_model_is_refused_before_ray_starts(tmp_path, tiny_vjepa2_dir, capsys,
                                                                          monkeypatch):
    """Found by the first reward before, after the demonstrations and behaviour cloning (3 min 30 s
    on the 2-core machine), as a Ray traceback; now the run's pre-flight, one line, no run
    directory. A saved model passes it."""
    from vla_rl.cli import main
    from vla_rl.dag.loader import load_template
    from vla_rl.preflight import preflight

    def no_ray(*args, **kwargs):
        raise AssertionError("Ray started")

    monkeypatch.setattr("vla_rl.driver.start_ray", no_ray)
    runs = tmp_path / "runs"
    encoder = ["algorithm.trajectory_encoder=vjepa2"]
    assert main(["train", "embodied_srpo_oft_lift", *encoder, f"algorithm.vjepa2={{model_dir: {tmp_path / 'none'}}}",
                 f"run.output_dir={runs}"]) == 2
    err = capsys.readouterr().err
    assert f"field 'algorithm.vjepa2': algorithm.vjepa2.model_dir '{tmp_path / 'none'}' has no config.json" in err
    assert not runs.exists()
    preflight(load_template("embodied_srpo_oft_lift", [*encoder, f"algorithm.vjepa2={{model_dir: {tiny_vjepa2_dir}}}"]))


def test_vjepa2_points_the_model_cannot_take_are_refused_before_ray_starts(tmp_path, tiny_vjepa2_dir):
    """63 frames for a model that takes them 2 at a time failed in the first reward, after the warm
    start and a rollout, as a Ray traceback."""
    import json

    from vla_rl.dag.loader import load_template
    from vla_rl.preflight import PreflightError, preflight

    tubelet = json.loads((tiny_vjepa2_dir / "config.json").read_text()).get("tubelet_size", 2)
    settings = ["algorithm.trajectory_encoder=vjepa2", f"algorithm.vjepa2.model_dir={tiny_vjepa2_dir}"]
    with pytest.raises(PreflightError) as info:
        preflight(load_template("embodied_srpo_oft_lift", [*settings, f"algorithm.vjepa2.points={3 * tubelet + 1}"]))
    assert info.value.field == "algorithm.vjepa2"
    assert f"algorithm.vjepa2.points {3 * tubelet + 1} is no multiple of the model's tubelet_size {tubelet}" in str(
        info.value)
    preflight(load_template("embodied_srpo_oft_lift", [*settings, f"algorithm.vjepa2.points={3 * tubelet}"]))


@pytest.mark.parametrize(("template", "settings", "rendered"), [
    ("embodied_srpo_oft_lift", ["algorithm.trajectory_encoder=policy_backbone", "algorithm.policy_backbone.camera=wrist"],
     "renders agentview"),
    ("embodied_srpo", ["algorithm.trajectory_encoder=vjepa2", "algorithm.vjepa2.model_dir=MODEL"],
     "renders no camera (state observations)"),
])
def test_a_frame_encoder_s_camera_the_simulator_does_not_render_is_refused_before_ray_starts(
        tmp_path, tiny_vjepa2_dir, template, settings, rendered):
    """The first reward found it, after the warm start and a rollout, as a Ray traceback (and the
    run directory stayed)."""
    from vla_rl.dag.loader import load_template
    from vla_rl.preflight import PreflightError, check_simulator

    settings = [s.replace("MODEL", str(tiny_vjepa2_dir)) for s in settings]
    encoder = settings[0].partition("=")[2]
    with pytest.raises(PreflightError) as info:
        check_simulator(load_template(template, settings).config)
    assert info.value.field == f"algorithm.{encoder}.camera"
    assert f"simulator.env.cameras {rendered}: add it there, or set algorithm.{encoder}.camera" in str(info.value)
    check_simulator(load_template(template, settings[:1]).config if encoder == "policy_backbone" else
                    load_template(template, [*settings, "simulator.env.cameras=[agentview]"]).config)


def test_binary_rewards_pay_the_overlong_penalty_and_report_the_failures_mean():
    """5 decision steps, buffer 2 (factor 1): |y| = finish_step; 3 -> 0, 4 -> -0.5, 5 -> -1.
    reward/failure_mean is over the failures, before the penalty."""
    from vla_rl.config import AlgorithmSection

    algo = AlgorithmSection(reward="success", overlong_buffer={"len": 2, "penalty_factor": 1.0})
    batch = TensorDict({keys.SUCCESS: torch.tensor([True, False, True, False]),
                        keys.TASK_ID: torch.zeros(4, dtype=torch.int64),
                        keys.FINISH_STEP: torch.tensor([3, 4, 5, 3]),
                        keys.RESPONSE_MASK: torch.ones(4, 5, dtype=torch.bool)}, batch_size=[4])
    rewards, metrics = episode_rewards(algo, batch)
    torch.testing.assert_close(rewards, torch.tensor([1.0, -0.5, 0.0, 0.0]))
    assert metrics["reward/failure_mean"].value == 0.0
    assert metrics["reward/mean"] == pytest.approx(0.125)
    plain, metrics = episode_rewards(AlgorithmSection(reward="success"), batch)
    assert plain.tolist() == [1.0, 0.0, 1.0, 0.0] and metrics["reward/mean"] == 0.5
