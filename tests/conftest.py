"""Shared fixtures: a Ray instance on loopback, a one-process group for the data-parallel code
(DDP, the collectives of the node functions) on the test device, the test device itself
(``VLA_RL_TEST_DEVICE``, tests/devices.py), one torch thread, the tiny language model, and the
text runs' generated prompts written once per session; the options ``--device-tests-only`` and
``--order-by-durations`` (tests/durations.py)."""

from __future__ import annotations

import devices
import durations
import pytest


def pytest_configure(config):
    problem = devices.check_test_device()
    if problem:
        raise pytest.UsageError(problem)
    if config.getoption("--order-by-durations"):
        config.pluginmanager.register(durations.DurationOrder(config.getoption("--order-by-durations")),
                                      "vla_rl_duration_order")
    # transformers binds its handler to the sys.stderr of the moment it first logs: inside a test
    # that captures stderr, a stream closed when that test ends, so that every later transformers
    # warning prints "--- Logging error ---" and a traceback into another test's output. Without
    # the handler, its warnings reach logging's last resort, which writes to the current stderr.
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_default_handler()


def pytest_report_header(config):
    return f"vla-rl test device: {devices.TEST_DEVICE_KIND} (VLA_RL_TEST_DEVICE)"


def pytest_addoption(parser):
    parser.addoption("--device-tests-only", action="store_true",
                     help="run only the tests that put something on VLA_RL_TEST_DEVICE (the others run the same on "
                          "every device: on a GPU they repeat the CPU run's checks); scripts/gpu_check.sh uses it")
    parser.addoption("--order-by-durations", metavar="JSON", default=None,
                     help="run the tests longest, shortest, second longest, ... by the durations this file records, "
                          "so that pytest-xdist shares them out well (tests/durations.py); scripts/gpu_check.sh uses "
                          "tests/device_test_durations.json")


#: Fixtures that hand a test the test device, or run on it.
DEVICE_FIXTURES = frozenset({"device", "process_group", "evaluated_lift_run"})
#: tests/devices.py's helpers: a test module that imports one runs its policies or DAG workers on the test device.
DEVICE_HELPERS = ("device_overrides", "device_under_test", "process_group_backend", "accelerator_count")


def uses_test_device(item) -> bool:
    """Whether a collected test puts something on ``VLA_RL_TEST_DEVICE``: it takes a fixture of
    :data:`DEVICE_FIXTURES`, or its module imports :data:`DEVICE_HELPERS` or tests/devices.py."""
    if DEVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    module = getattr(item, "module", None)
    return any(_is_devices_module_or_helper(value) for value in vars(module).values()) if module else False


def _is_devices_module_or_helper(value) -> bool:
    """tests/devices.py or one of its :data:`DEVICE_HELPERS`, by file: ``import devices`` and
    ``import tests.devices`` load two module objects of one file."""
    if getattr(value, "__file__", None) == devices.__file__:
        return True
    code = getattr(value, "__code__", None)
    return code is not None and code.co_filename == devices.__file__ and value.__name__ in DEVICE_HELPERS


#: Fixtures that run on the engine's Ray: a test taking one is an end-to-end test (marked ``e2e``).
ENGINE_FIXTURES = frozenset({"ray_on_loopback", "evaluated_lift_run"})


def mark_end_to_end(items) -> None:
    """Mark ``e2e`` the tests that take an :data:`ENGINE_FIXTURES` fixture and are not ``slow``:
    the default run (``-m 'not slow and not e2e'``), ``-m e2e`` and ``-m slow`` split the suite in
    three. A test marked both is refused (``-m e2e`` would run a slow test)."""
    for item in items:
        marks = {mark.name for mark in item.iter_markers()}
        if {"slow", "e2e"} <= marks:
            raise pytest.UsageError(f"{item.nodeid} is marked both slow and e2e: mark it one of them")
        if "slow" not in marks and ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


@pytest.hookimpl(tryfirst=True)  # before pytest's -m deselects by the marks
def pytest_collection_modifyitems(config, items):
    mark_end_to_end(items)
    if config.getoption("--device-tests-only"):
        kept = [item for item in items if uses_test_device(item)]
        config.hook.pytest_deselected(items=[item for item in items if not uses_test_device(item)])
        items[:] = kept
    config.stash[END_TO_END_COLLECTED] = sum(item.get_closest_marker("e2e") is not None for item in items)


#: End-to-end tests collected (after ``--device-tests-only``), and those the run's marks left out.
END_TO_END_COLLECTED, END_TO_END_LEFT_OUT = pytest.StashKey[int](), pytest.StashKey[int]()


def pytest_collection_finish(session):
    selected = sum(item.get_closest_marker("e2e") is not None for item in session.items)
    session.config.stash[END_TO_END_LEFT_OUT] = session.config.stash.get(END_TO_END_COLLECTED, 0) - selected


def pytest_terminal_summary(terminalreporter, config):
    """One line on the end-to-end tests the marks left out (the default run leaves them all out:
    ``pytest tests/test_driver.py`` alone would otherwise just say "deselected")."""
    left_out = config.stash.get(END_TO_END_LEFT_OUT, 0)
    if left_out and "not e2e" in config.option.markexpr:  # left out by -m, not by -k alone
        terminalreporter.write_line(f"{left_out} end-to-end tests not run (marked e2e): add -m e2e, or -m 'not slow' "
                                    "for every test but the slow ones")


@pytest.fixture(scope="session")
def device():
    """The torch device of the unit tests' policies and batches (``VLA_RL_TEST_DEVICE``)."""
    return devices.device_under_test()


@pytest.fixture
def bf16_device(device, monkeypatch):
    """A device where ``trainer.mixed_precision: auto`` means bfloat16: the test device when it is
    an accelerator (CUDA, NPU), else the CPU admitted as one (the bf16 emulation: CPU autocast's
    bfloat16 kernels)."""
    from vla_rl.trainers import strategy

    if device.type not in strategy.ACCELERATORS:
        monkeypatch.setattr(strategy, "ACCELERATORS", (*strategy.ACCELERATORS, device.type))
    return device


@pytest.fixture
def tf32_off():
    """Both TF32 flags (``torch.backends.cuda.matmul.allow_tf32``, ``torch.backends.cudnn.allow_tf32``)
    off for the test, then as they were. They are torch's process-wide C state, not attributes
    monkeypatch could restore, and may be set without a GPU."""
    import torch

    previous = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = previous


@pytest.fixture(scope="session")
def ray_on_loopback():
    """Ray started the way the project starts it (every listener on 127.0.0.1)."""
    import ray

    from vla_rl.utils.ray_utils import init_ray

    init_ray(num_cpus=8)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A one-process process group for the module's tests with a DAG worker's backend on the test
    device (gloo; ``cpu:gloo,cuda:nccl`` on CUDA), on loopback as a local run's
    (:func:`devices.pin_collectives_to_loopback`), rendezvous through a file store (a TCP store
    would listen on every interface)."""
    import torch.distributed as dist

    devices.device_under_test()
    devices.pin_collectives_to_loopback()
    store = dist.FileStore(str(tmp_path_factory.mktemp("gloo_store") / "store"), 1)
    dist.init_process_group(devices.process_group_backend(), store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def torch_one_thread():
    """torch on one intra-op thread for a test module: on the shared 2-core machines two threads
    contend with the other processes and run small models about 10x slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def _generated_prompt_files(tmp_path_factory):
    """The session's store of :func:`generated_prompts_once`: its directory and ``{key: paths}``."""
    return tmp_path_factory.mktemp("generated_prompts"), {}


@pytest.fixture
def generated_prompts_once(monkeypatch, _generated_prompt_files):
    """``vla_rl.workflows.text_assets.write_generated_prompts`` (the arithmetic splits of a text
    run whose prompt files are null) runs once per setting in the session; later calls get a copy
    of its files. The pre-flight of every such run writes them (about 0.8 s here: 8256 problems in
    row groups of 16), and the pre-flight tests run it a few hundred times. The function is
    deterministic (a seeded draw); tests/data/test_arithmetic.py checks what it writes, and
    test_preflight.py compares the rows the pre-flight checked with ``ensure_text_assets``'s."""
    import shutil
    from pathlib import Path

    from vla_rl.workflows import text_assets

    root, written = _generated_prompt_files
    write = text_assets.write_generated_prompts

    def write_once(config, out_dir):
        text = config.text
        levels = None if text.arithmetic_levels is None else tuple(text.arithmetic_levels)
        key = (text.num_generated_train, text.num_generated_test, config.run.seed, levels)
        if key not in written:
            written[key] = write(config, root / str(len(written)))
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        return {split: Path(shutil.copy(path, Path(out_dir) / path.name)) for split, path in written[key].items()}

    monkeypatch.setattr(text_assets, "write_generated_prompts", write_once)


@pytest.fixture(scope="session")
def tiny_lm_dir(tmp_path_factory):
    """A tiny Qwen2-style checkpoint (2 layers, hidden 64) with its in-process trained tokenizer."""
    from policies.causal_lm.tiny import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny_lm"), seed=0)


@pytest.fixture(scope="session")
def tiny_vjepa2_dir(tmp_path_factory):
    """A tiny V-JEPA 2 (1 layer, hidden 32, 32x32 crops of 16x16 patches) saved to a directory."""
    import torch
    from transformers import VJEPA2Config, VJEPA2Model

    torch.manual_seed(0)
    config = VJEPA2Config(
        crop_size=32, patch_size=16, frames_per_clip=4, tubelet_size=2, hidden_size=32, num_attention_heads=2,
        num_hidden_layers=1, mlp_ratio=2.0, pred_hidden_size=32, pred_num_attention_heads=2,
        pred_num_hidden_layers=1, num_pooler_layers=1,
    )
    path = tmp_path_factory.mktemp("vjepa2")
    VJEPA2Model(config).save_pretrained(path)
    return path


EVALUATED_LIFT_HORIZON = 30
"""Control steps of :func:`evaluated_lift_run`'s episodes."""


@pytest.fixture(scope="session")
def evaluated_lift_run(tmp_path_factory, ray_on_loopback):
    """A main-job (robosuite Lift) run directory with one checkpoint of a random MLP (hidden [16])
    and ``vla-rl eval``'s greedy evaluation of it: 3 held-out episodes of 30 control steps,
    stored under ``<run>/eval/``."""
    import torch

    from policies import make_policy
    from policies.mlp import MLPPolicyConfig
    from vla_rl.checkpoints import files as checkpoint
    from vla_rl.cli import main
    from vla_rl.driver import prepare_run_dir

    horizon = EVALUATED_LIFT_HORIZON
    out = tmp_path_factory.mktemp("evaluated")
    run, _, _ = prepare_run_dir("embodied_srpo", [f"run.output_dir={out}", "run.name=evaluated",
                                                  "policy.config.hidden_sizes=[16]", f"simulator.env.horizon={horizon}"],
                                resume=None)
    run.close()
    policy = make_policy("mlp", MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=(16,)))
    torch.manual_seed(5)
    for parameter in policy.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    checkpoint.save_checkpoint(run.path / "checkpoints", 1, rank=0, model=policy)
    checkpoint.finalize_checkpoint(run.path / "checkpoints", 1)
    overrides = [*devices.device_overrides(num_workers=1), "workers.num_workers=1", "eval.num_episodes=3",
                 "eval.video_episodes=0", "eval.protocols=[greedy]", f"simulator.env.horizon={horizon}",
                 "simulator.num_cpus_per_actor=0"]
    assert main(["eval", str(run.path), *overrides]) == 0
    return run.path
