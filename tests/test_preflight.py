"""Pre-flight checks (vla_rl/preflight/): a table of malformed prompt files and model
checkpoints, each refused before anything starts with a PreflightError naming the file and the
config field, and through the command line with exit status 2, one line, no traceback and
nothing created on disk; the good inputs pass (strict loading at run time:
tests/test_strict_loading.py)."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from checkpoint_inputs import (
    PI0,
    PI0_FROM_DIR,
    TEXT,
    VLA,
    VLA_FROM_DIR,
    Assets,
    action_statistics_file,
    copy_dir,
    good_lines,
    jsonl,
    make_assets,
    parquet,
    proprio_projector_file,
    rename_first_layer,
    resize_vocabulary,
    rewrite_weights,
    rows,
    to_pickle,
    truncate,
    unlink_files,
    widen,
    write_file,
)
from cli_refusals import assert_cli_refuses_and_writes_nothing
from safetensors.torch import save_file

from vla_rl.cli import main
from vla_rl.dag.loader import load_template
from vla_rl.preflight import PreflightError, preflight

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_lm_dir) -> Assets:
    return make_assets(tmp_path_factory, tiny_lm_dir)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


# ----------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """A malformed input: ``make(tmp, assets) -> (overrides, offending path)``; the error must name
    ``field`` and the offending path and match ``match``; ``template`` is the template it runs."""

    name: str
    make: Callable[[Path, Assets], tuple[list[str], Path]]
    field: str
    match: str
    template: str = TEXT
    node: str | None = None


def train_file(make_file: Callable[[Path, Assets], Path], *extra: str):
    def make(tmp: Path, assets: Assets):
        path = make_file(tmp, assets)
        return [f"text.train_file={path}", *extra], path
    return make


def held_out_file(make_file: Callable[[Path, Assets], Path]):
    def make(tmp: Path, assets: Assets):
        path = make_file(tmp, assets)
        return [f"text.train_file={assets.train}", f"text.test_file={path}"], path
    return make


def lm_dir(damage: Callable[[Path], Path | None], *extra: str):
    """A copy of the tiny LM damaged by ``damage(dir)`` (returns the offending path, default the dir)."""
    def make(tmp: Path, assets: Assets):
        directory = copy_dir(assets.lm, tmp / "lm")
        return [f"text.model_path={directory}", *extra], damage(directory) or directory
    return make


def vla_dir(damage: Callable[[Path], Path | None], *extra: str):
    def make(tmp: Path, assets: Assets):
        directory = copy_dir(assets.vla, tmp / "vla")
        return [*VLA_FROM_DIR, f"policy.config.model_path={directory}", *extra], damage(directory) or directory
    return make


def pi0_dir(damage: Callable[[Path], Path | None], *extra: str):
    def make(tmp: Path, assets: Assets):
        directory = copy_dir(assets.pi0, tmp / "pi0")
        return [*PI0_FROM_DIR, f"policy.config.model_path={directory}", *extra], damage(directory) or directory
    return make


def mlp_dir(damage: Callable[[Path], Path | None], *extra: str, hidden_sizes: tuple[int, ...] = (256, 256)):
    """An MLP policy saved as `vla-rl export` writes it (embodied_srpo's MLP: hidden sizes 256, 256),
    damaged by ``damage(dir)``; ``extra``: overrides before its model_path."""
    def make(tmp: Path, assets: Assets):
        from policies.mlp import MLPPolicy, MLPPolicyConfig

        directory = MLPPolicy(MLPPolicyConfig(obs_dim=15, action_dim=7, hidden_sizes=hidden_sizes)).save_pretrained(
            tmp / "mlp")
        return [*extra, f"policy.config.model_path={directory}"], damage(directory) or directory
    return make


def _missing_tokenizer_path(tmp: Path, assets: Assets):
    directory = copy_dir(assets.pi0, tmp / "pi0")
    return [*PI0_FROM_DIR, f"policy.config.model_path={directory}", f"policy.config.tokenizer_path={tmp / 'none'}"], \
        tmp / "none"


def _foreign_noise_head(directory: Path) -> Path:
    save_file({"mlp.0.weight": torch.zeros(3, 3)}, directory / "pi0_noise_head.safetensors")
    return directory / "pi0_noise_head.safetensors"


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


def _empty(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def _missing_shard(directory: Path) -> Path:
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model-00002-of-00002.safetensors"}}
    (directory / "model.safetensors").unlink()
    (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    return directory / "model.safetensors.index.json"


def _gguf_dir(tmp: Path, assets: Assets):
    directory = tmp / "gguf_dir"
    directory.mkdir()
    (directory / "model.gguf").write_bytes(b"LLAMA\x00\x01" + bytes(64))
    return [f"text.model_path={directory}", "text.gguf_file=model.gguf"], directory / "model.gguf"


def _gguf_missing(tmp: Path, assets: Assets):
    directory = _mkdir(tmp / "gguf_dir")
    return [f"text.model_path={directory}", "text.gguf_file=model.gguf"], directory / "model.gguf"


def _empty_table(path: Path) -> Path:
    table = pa.Table.from_pylist(rows(1))
    pq.write_table(table.slice(0, 0), path)
    return path


def _default_row_groups(path: Path) -> Path:
    """A small file written with pyarrow's default row groups: one row group."""
    pq.write_table(pa.Table.from_pylist(rows(64)), path)
    return path


def _text_checkpoint(model_copy: bool):
    """A training checkpoint of a text run given as text.model_path: with its ``hf_model/`` copy
    (DDP without LoRA), or without one (FSDP, LoRA)."""
    def make(tmp: Path, assets: Assets):
        checkpoint = tmp / "run" / "checkpoints" / "step_00000002"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.json").write_text("{}")
        if model_copy:
            copy_dir(assets.lm, checkpoint / "hf_model")
        return [f"text.model_path={checkpoint}"], checkpoint
    return make


CASES = [
    Case("a text run's training checkpoint as the model", _text_checkpoint(False), "text.model_path",
         r"is a training checkpoint \(trainer_state.json\), not a model directory: it holds no hf_model/ copy .*vla-rl "
         "export"),
    Case("a text run's training checkpoint with its model copy", _text_checkpoint(True), "text.model_path",
         "is a training checkpoint .*: give its model copy, .*step_00000002/hf_model"),
    Case("a training file without held-out prompts", lambda t, a: ([f"text.train_file={a.train}"], a.train),
         "text.test_file", "null with text.train_file set .*: the evaluation would score the generated arithmetic"),
    # prompt files
    Case("missing train file", train_file(lambda t, a: t / "nowhere.parquet"), "text.train_file", "does not exist"),
    Case("directory", train_file(lambda t, a: _mkdir(t / "dir.parquet")), "text.train_file", "is a directory"),
    Case("zero-byte parquet", train_file(lambda t, a: _empty(t / "z.parquet")), "text.train_file", r"empty \(0 bytes\)"),
    Case("zero-byte jsonl", train_file(lambda t, a: _empty(t / "z.jsonl")), "text.train_file", r"empty \(0 bytes\)"),
    Case("garbage parquet", train_file(lambda t, a: write_file("g.parquet", b"not parquet at all" * 20)(t)),
         "text.train_file", "not a parquet file: no PAR1 magic bytes at its start"),
    Case("truncated parquet", train_file(lambda t, a: truncate(shutil.copy(a.train, t / "t.parquet"))),
         "text.train_file", "no PAR1 magic bytes at its end"),
    Case("corrupt parquet footer", train_file(lambda t, a: write_file("f.parquet", b"PAR1" + bytes(200) + b"PAR1")(t)),
         "text.train_file", "unreadable parquet footer"),
    Case("unknown suffix", train_file(lambda t, a: write_file("p.csv", b"prompt,answer\n")(t)), "text.train_file",
         "unknown prompt file type"),
    Case("latin-1 jsonl", train_file(lambda t, a: jsonl(t / "l.jsonl", [good_lines(1)[0], json.dumps(
        rows(1)[0], ensure_ascii=False).replace("What", "Qu'est-ce caf\u00e9").encode("latin-1")])),
        "text.train_file", r"line 2 is not valid UTF-8 \(byte 0xe9"),
    Case("invalid json line", train_file(lambda t, a: jsonl(t / "j.jsonl", [*good_lines(2), b'{"prompt": [']),),
         "text.train_file", "line 3 is not valid JSON"),
    Case("jsonl line not an object", train_file(lambda t, a: jsonl(t / "o.jsonl", [*good_lines(3), b"[1, 2]"])),
         "text.train_file", "line 4 is a JSON list, not an object"),
    Case("jsonl missing ground truth", train_file(lambda t, a: jsonl(t / "m.jsonl", [good_lines(1)[0], json.dumps(
        rows(1, reward_model={"style": "rule"})[0]).encode()])),
        "text.train_file", r"row 1 has no column 'reward_model.ground_truth' \(line 2\)"),
    Case("jsonl prompt not messages", train_file(lambda t, a: jsonl(t / "s.jsonl", [json.dumps(
        rows(1, prompt="What is 1 + 1?")[0]).encode()])), "text.train_file", "'prompt' must be a non-empty list"),
    Case("jsonl without sft column", train_file(lambda t, a: jsonl(t / "x.jsonl", [json.dumps(
        {k: v for k, v in row.items() if k != "extra_info"}).encode() for row in rows(40)])),
        "text.sft_response_column", "no column 'extra_info.answer' .*: the supervised warm start's targets .*, or "
        "set text.sft_steps=0$"),
    Case("jsonl blank lines only", train_file(lambda t, a: write_file("b.jsonl", b"\n  \n\n")(t)), "text.train_file",
         "the file has no rows"),
    Case("parquet missing prompt", train_file(lambda t, a: parquet(t / "p.parquet", [
        {k: v for k, v in row.items() if k != "prompt"} for row in rows()])), "text.train_file",
        "missing column 'prompt'"),
    Case("parquet missing ground truth", train_file(lambda t, a: parquet(t / "g.parquet", rows(
        reward_model={"style": "rule"}))), "text.train_file", "missing column 'reward_model.ground_truth'"),
    Case("parquet prompt is a string", train_file(lambda t, a: parquet(t / "s.parquet", rows(prompt="What?")),
                                                  "text.sft_steps=0"),
         "text.train_file", "column 'prompt' must hold lists"),
    Case("parquet without sft column", train_file(lambda t, a: parquet(t / "x.parquet", [
        {k: v for k, v in row.items() if k != "extra_info"} for row in rows(40)])), "text.sft_response_column",
        "missing column 'extra_info.answer'"),
    Case("llm_sft pairs without targets", train_file(lambda t, a: parquet(t / "x.parquet", [
        {k: v for k, v in row.items() if k != "extra_info"} for row in rows(64)])), "text.sft_response_column",
        r"missing column 'extra_info.answer' .*: the supervised fine-tuning's targets are read from this column; name "
        r"the file's column that holds them \(dotted for a nested field\)$", template="llm_sft"),
    Case("empty parquet", train_file(lambda t, a: _empty_table(t / "e.parquet")), "text.train_file",
         "the file has no rows"),
    Case("default row groups: one for two shards", train_file(lambda t, a: _default_row_groups(t / "d.parquet")),
         "text.train_file", r"has 1 row groups, fewer than the 2 shards.*row_group_size=", node="prompts"),
    Case("row groups dealt unevenly", train_file(lambda t, a: parquet(t / "u.parquet", rows(30), 10),
                                                 "text.prompts_per_step=24"),
         "text.train_file", r"smallest shard has 10 rows, fewer than the 12 .*row_group_size=", node="prompts"),
    Case("too few rows for a step", train_file(lambda t, a: parquet(t / "f.parquet", rows(10), 2)),
         "text.train_file", "fewer than the 8 prompts .*lower prompts_per_step or add rows", node="prompts"),
    Case("too few rows for dynamic sampling's refill rounds",
         train_file(lambda t, a: parquet(t / "r.parquet", rows(40), 20)), "algorithm.filter_groups.max_refill_rounds",
         r"r.parquet: its smallest shard \(2 shards\) has 20 rows; a step with all 3 refill rounds takes 32 "
         r"different ones \(8 a round\): set at most 1 rounds", template="llm_dapo", node="prompts"),
    Case("garbage test file", held_out_file(lambda t, a: write_file("test.parquet", b"\x00" * 100)(t)), "text.test_file",
         "not a parquet file"),
    Case("test file with one row group", held_out_file(lambda t, a: _default_row_groups(t / "test.parquet")),
         "text.test_file", "has 1 row groups, fewer than the 2 shards"),
    # causal LM checkpoints
    Case("missing model dir", lambda t, a: ([f"text.model_path={t / 'nope'}"], t / "nope"), "text.model_path",
         "does not exist"),
    Case("model path is a file", lambda t, a: ([f"text.model_path={a.lm / 'config.json'}"], a.lm / "config.json"),
         "text.model_path", "is a file, not a model directory"),
    Case("no config.json", lm_dir(unlink_files("config.json")), "text.model_path", "no config.json"),
    Case("corrupt config.json", lm_dir(write_file("config.json", b'{"model_type": "qwen2",')), "text.model_path",
         "config.json: not valid JSON"),
    Case("unknown architecture", lm_dir(write_file("config.json", b'{"model_type": "no_such_model"}')),
         "text.model_path", "config.json: not a usable model config"),
    Case("no tokenizer files", lm_dir(unlink_files("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")),
         "text.model_path", "no usable tokenizer"),
    Case("fallback tokenizer (tokenizer.json missing)", lm_dir(unlink_files("tokenizer.json")), "text.model_path",
         r"no usable tokenizer: it encodes 'What is 12 \+ 7\?' to \[\]"),
    Case("no chat template in chat mode", lm_dir(unlink_files("chat_template.jinja")), "text.model_path",
         "no chat template.*text.prompt_format: raw"),
    Case("truncated safetensors", lm_dir(lambda d: truncate(d / "model.safetensors", 0.6)), "text.model_path",
         "model.safetensors: truncated"),
    Case("garbage safetensors", lm_dir(write_file("model.safetensors", b"\xff" * 64)), "text.model_path",
         "not a safetensors file"),
    Case("wrong tensor names", lm_dir(lambda d: rewrite_weights(d, rename_first_layer)), "text.model_path",
         r"do not match the architecture: 12 missing \(model\.layers\.0\..*12 unexpected \(model\.blocks\.0\."),
    Case("wrong shapes", lm_dir(lambda d: rewrite_weights(d, widen("model.layers.1.mlp.up_proj.weight"))),
         "text.model_path", r"model\.layers\.1\.mlp\.up_proj\.weight: \(129, 64\) in the checkpoint, \(128, 64\)"),
    Case("missing tensor", lm_dir(lambda d: rewrite_weights(d, lambda s: {k: v for k, v in s.items()
                                                                       if k != "model.norm.weight"})),
         "text.model_path", r"1 missing \(model\.norm\.weight\)"),
    Case("a tokenizer larger than the vocabulary", lm_dir(lambda d: resize_vocabulary(d, 280) and d),
         "text.model_path", "the tokenizer has 284 tokens, more than the model's vocab_size 280"),
    Case("no weights", lm_dir(unlink_files("model.safetensors")), "text.model_path", "has no weights"),
    Case("pickle weights without allow_pickle", lm_dir(to_pickle), "text.model_path",
         "pickle weights are refused.*text.allow_pickle: true"),
    Case("index lists a missing shard", lm_dir(_missing_shard), "text.model_path",
         "lists model-00002-of-00002.safetensors, which does not exist"),
    Case("corrupt .gguf model_path", lambda t, a: ([f"text.model_path={write_file('m.gguf', b'PK' + bytes(30))(t)}"],
                                                   t / "m.gguf"), "text.model_path", "not a GGUF file"),
    Case("corrupt gguf_file", _gguf_dir, "text.gguf_file", "not a GGUF file: it starts with b'LLAM'"),
    Case("missing gguf_file", _gguf_missing, "text.gguf_file", "GGUF file .* does not exist"),
    # OpenVLA-OFT checkpoints (policy.config.model_path)
    Case("missing VLA dir", lambda t, a: ([*VLA_FROM_DIR, f"policy.config.model_path={t / 'none'}"], t / "none"),
         "policy.config.model_path", "the model directory does not exist", template=VLA),
    Case("VLA corrupt config.json", vla_dir(write_file("config.json", b"{")), "policy.config.model_path",
         "config.json: not valid JSON", template=VLA),
    Case("VLA truncated safetensors", vla_dir(lambda d: truncate(d / "model.safetensors", 0.3)),
         "policy.config.model_path", "truncated", template=VLA),
    Case("VLA wrong tensor names", vla_dir(lambda d: rewrite_weights(d, lambda s: {
        k.replace("projector.fc1", "projector.first"): v for k, v in s.items()})), "policy.config.model_path",
        r"2 missing \(projector\.fc1\.bias, projector\.fc1\.weight\); 2 unexpected \(projector\.first\.", template=VLA),
    Case("VLA wrong shapes", vla_dir(lambda d: rewrite_weights(d, widen("projector.fc1.weight"))),
         "policy.config.model_path", r"projector\.fc1\.weight: \(\d+, \d+\) in the checkpoint", template=VLA),
    Case("VLA without tokenizer", vla_dir(unlink_files("tokenizer.json", "tokenizer_config.json")),
         "policy.config.model_path", "no tokenizer", template=VLA),
    Case("VLA pickle weights", vla_dir(to_pickle), "policy.config.model_path",
         "pickle weights are refused.*policy.config.allow_pickle: true", template=VLA),
    Case("VLA missing proprio projector", vla_dir(lambda d: None, "policy.config.proprio_dim=5"),
         "policy.config.model_path", r"needs one proprio_projector--\*checkpoint\.pt", template=VLA),
    # both passed plan and stopped every worker after it loaded the model, with a Ray traceback
    Case("VLA unnorm_key it has no statistics of", vla_dir(action_statistics_file("libero_spatial"),
                                                         "policy.config.unnorm_key=libero_goal"),
         "policy.config.unnorm_key", r"unnorm_key 'libero_goal' is not in .*; choose one of \['libero_spatial'\]",
         template=VLA),
    Case("VLA statistics of another action size", vla_dir(action_statistics_file("libero_spatial", action_dim=6),
                                                        "policy.config.unnorm_key=libero_spatial"),
         "policy.config.action_dim", "action statistics of 'libero_spatial' have 6 dimensions, config.action_dim "
         "is 7", template=VLA),
    Case("VLA statistics it picks by itself of another action size", vla_dir(action_statistics_file("x", action_dim=2)),
         "policy.config.action_dim", "dataset_statistics.json: action statistics of 'x' have 2 dimensions, "
         "config.action_dim is 7", template=VLA),
    Case("VLA unnorm_key without statistics", vla_dir(write_file("dataset_statistics.json", b"{}"),
                                                      "policy.config.unnorm_key=bridge"),
         "policy.config.unnorm_key", "holds no action statistics, so unnorm_key 'bridge' names none", template=VLA),
    # a traceback ending in torch's hint to load with weights_only=False, and "[Errno 22] Invalid argument"
    Case("VLA garbage proprio projector", vla_dir(write_file("proprio_projector--checkpoint.pt", b"garbage\n"),
                                                  "policy.config.proprio_dim=5"),
         "policy.config.model_path", "unreadable pickle weights: not a torch file, or it holds objects other than "
         "tensors", template=VLA),
    Case("VLA truncated proprio projector", vla_dir(lambda d: truncate(proprio_projector_file(5)(d), 0.5),
                                                    "policy.config.proprio_dim=5"),
         "policy.config.model_path", "unreadable pickle weights, damaged or truncated", template=VLA),
    Case("VLA proprio projector of another proprio_dim", vla_dir(proprio_projector_file(5), "policy.config.proprio_dim=8"),
         "policy.config.proprio_dim", r"does not fit the config's proprio_projector: 1 with another shape "
         r"\(fc1\.weight: \(\d+, 5\) in the checkpoint, \(\d+, 8\) in the model\)", template=VLA),
    # MLP policy directories (policy.config.model_path: vla-rl export of an MLP run)
    Case("missing MLP dir", lambda t, a: ([f"policy.config.model_path={t / 'none'}"], t / "none"),
         "policy.config.model_path", "config.json is missing", template="embodied_srpo"),
    Case("MLP corrupt config.json", mlp_dir(write_file("config.json", b"{")), "policy.config.model_path",
         "config.json: not valid JSON", template="embodied_srpo"),
    Case("MLP config.json of no policy", mlp_dir(write_file("config.json", b'{"hidden_sizes": [8]}')),
         "policy.config.model_path", "is not an MLP policy's configuration", template="embodied_srpo"),
    # both started Ray and the workers, and stopped with a traceback of about 70 lines
    Case("MLP truncated safetensors", mlp_dir(lambda d: truncate(d / "model.safetensors", 0.9)),
         "policy.config.model_path", r"model\.safetensors: truncated: its header places tensor data up to byte",
         template="embodied_srpo"),
    Case("MLP weights of another width", mlp_dir(lambda d: rewrite_weights(d, widen("mean_net.0.weight"))),
         "policy.config.model_path", r"model\.safetensors does not hold the weights .*config\.json describes: 1 with "
         r"another shape \(mean_net\.0\.weight: \(257, \d+\) in the checkpoint, \(256, \d+\) in the model\)",
         template="embodied_srpo"),
    Case("MLP directory for the OFT template", mlp_dir(lambda d: None, *VLA_FROM_DIR), "policy.config.model_path",
         r"holds a 'mlp' policy \(its config.json\), not a 'openvla_oft' one: use a template of the mlp policy",
         template=VLA),
    Case("training checkpoint as model_path", lambda t, a: (
        [f"policy.config.model_path={write_file('trainer_state.json', b'{}')(_mkdir(t / 'step_00000004')).parent}"],
        t / "step_00000004"), "policy.config.model_path",
        r"is a training checkpoint \(trainer_state.json\), not a model directory: evaluate it with vla-rl eval",
        template="embodied_srpo"),
    Case("MLP of other hidden sizes", mlp_dir(lambda d: None, hidden_sizes=(8,)), "policy.config.hidden_sizes",
         r"holds an MLP policy with hidden_sizes \(8,\), the config gives \(256, 256\)", template="embodied_srpo"),
    # π0 checkpoints (policy.config.model_path, policy.config.tokenizer_path)
    Case("missing π0 dir", lambda t, a: ([*PI0_FROM_DIR, f"policy.config.model_path={t / 'none'}"], t / "none"),
         "policy.config.model_path", "the model directory does not exist", template=PI0),
    Case("π0 without architecture file", pi0_dir(unlink_files("pi0_architecture.json")), "policy.config.model_path",
         "has neither pi0_architecture.json nor config.json", template=PI0),
    Case("π0 corrupt pi0_architecture.json", pi0_dir(write_file("pi0_architecture.json", b"{")),
         "policy.config.model_path", "pi0_architecture.json: not valid JSON", template=PI0),
    Case("π0 unknown architecture field", pi0_dir(write_file("pi0_architecture.json", b'{"bogus": 1}')),
         "policy.config.model_path", "not a usable π0 architecture .*unexpected keyword argument 'bogus'",
         template=PI0),
    Case("π0 truncated safetensors", pi0_dir(lambda d: truncate(d / "model.safetensors", 0.3)),
         "policy.config.model_path", "truncated", template=PI0),
    Case("π0 wrong tensor names", pi0_dir(lambda d: rewrite_weights(d, lambda s: {
        k.replace("action_out_proj", "action_out"): v for k, v in s.items()})), "policy.config.model_path",
        r"2 missing \(model\.action_out_proj\.bias, model\.action_out_proj\.weight\); 2 unexpected", template=PI0),
    Case("π0 pickle weights", pi0_dir(to_pickle), "policy.config.model_path",
         "pickle weights are refused .*convert them to safetensors", template=PI0),
    Case("π0 without tokenizer", pi0_dir(unlink_files("tokenizer.json", "tokenizer_config.json")),
         "policy.config.model_path", "no usable tokenizer.*; or set tokenizer_path to a directory holding the "
         r"model's tokenizer \(PaliGemma's for openpi's checkpoints\)", template=PI0),
    Case("π0 missing tokenizer_path", _missing_tokenizer_path, "policy.config.tokenizer_path",
         "the tokenizer directory does not exist", template=PI0),
    Case("π0 malformed norm_stats.json", pi0_dir(write_file("norm_stats.json", b'{"norm_stats": {"actions": {}}}')),
         "policy.config.model_path", "actions statistics need q01 and q99", template=PI0),
    Case("π0 noise head of another shape", pi0_dir(_foreign_noise_head, "policy.config.sampler=flow_noise"),
         "policy.config.model_path", "the noise head does not fit", template=PI0),
    Case("π0 executed_actions not dividing the chunk", pi0_dir(lambda d: None, "policy.config.executed_actions=3"),
         "policy.config.model_path", r"executed_actions \(3\) must divide the model's chunk_size \(8\)", template=PI0),
]


def test_the_table_covers_at_least_30_distinct_cases():
    assert len({case.name for case in CASES}) == len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_malformed_input_is_refused_before_anything_starts(case, assets, tmp_path, capsys):
    overrides, offending = case.make(tmp_path, assets)
    with pytest.raises(PreflightError, match=case.match) as raised:
        preflight(load_template(case.template, overrides))
    error = raised.value
    assert error.field == case.field and error.node == case.node
    assert str(offending) in str(error), str(error)
    assert f"field {case.field!r}" in str(error)

    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, [case.template, *overrides], case.field, offending)


@pytest.mark.parametrize("overrides", [
    [],  # the model and prompts the run generates (the prompts checked in a temporary directory)
    ["text.model_path={lm}", "text.train_file={train}", "text.test_file={test}"],
    ["text.model_path={lm_raw}", "text.prompt_format=raw"],  # no chat template: fine for raw prompts
    ["text.model_path={lm_pickle}", "text.allow_pickle=true"],
    ["text.model_path={lm_renamed}", "policy.allow_partial_load=true"],
    ["text.train_file={jsonl}", "text.test_file={jsonl}", "text.prompts_per_step=8"],
], ids=["generated", "files", "raw prompts", "allowed pickle", "allowed partial load", "jsonl"])
def test_good_inputs_pass(overrides, assets, tmp_path):
    paths = {"lm": assets.lm, "train": assets.train, "test": assets.test,
             "lm_raw": copy_dir(assets.lm, tmp_path / "raw"), "lm_pickle": copy_dir(assets.lm, tmp_path / "pickle"),
             "lm_renamed": copy_dir(assets.lm, tmp_path / "renamed"),
             "jsonl": jsonl(tmp_path / "p.jsonl", good_lines(16))}
    (paths["lm_raw"] / "chat_template.jinja").unlink()
    to_pickle(paths["lm_pickle"])
    rewrite_weights(paths["lm_renamed"], rename_first_layer)
    preflight(load_template(TEXT, [item.format(**paths) for item in overrides]))


@pytest.mark.parametrize(("overrides", "field", "offending", "match"), [
    (["text.max_response_length=12"], "text.train_file", "the generated arithmetic train split",
     r"supervised targets .* raise text.max_response_length to (\d+)$"),
    (["text.max_prompt_length=8"], "text.train_file", "the generated arithmetic train split",
     r"prompts are longer .* raise text.max_prompt_length to (\d+)$"),
    (["text.num_generated_train=10"], "text.num_generated_train", "the generated arithmetic train split",
     r"has 10 rows, in fewer row groups than the 2 shards that read it, and each shard takes \d+ a step: "
     r"raise text.num_generated_train to (\d+) or more$"),
    (["text.num_generated_test=1"], "text.num_generated_test", "the generated arithmetic test split",
     r"has 1 rows, in fewer row groups than the 2 shards that read it, and each shard reads a row group of its "
     r"own: raise text.num_generated_test to (\d+) or more$"),
    (["text.num_generated_train=20", "text.prompts_per_step=32"], "text.num_generated_train",
     "the generated arithmetic train split", r"has 20 rows, dealt in whole row groups to 2 shards of \d+, \d+ rows, "
     r"and each shard takes 16 a step: raise text.num_generated_train to (\d+) or more$"),
], ids=["sft targets too long", "prompts too long", "too few training rows", "too few held-out rows",
        "too few rows a shard"])
def test_the_generated_prompts_are_checked_like_given_files(overrides, field, offending, match, tmp_path, capsys,
                                                            monkeypatch):
    """A run without prompt files generates them in its workers; the pre-flight generates the same
    rows in a temporary directory (removed afterwards) and refuses what the workers would fail on
    (before: ``text.max_response_length=12`` raised in the warm start's first step, after Ray
    started, as a remote traceback). The length it asks for is the one that passes."""

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    with pytest.raises(PreflightError, match=match) as raised:
        preflight(load_template(TEXT, overrides))
    assert raised.value.field == field and offending in str(raised.value)
    assert not any(scratch.iterdir())
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, [TEXT, *overrides], field, offending)
    found = re.search(match, str(raised.value))
    if found.groups():  # a length or a row count: asking for it passes
        setting = overrides[0].split("=")[0]
        preflight(load_template(TEXT, [*overrides[1:], f"{setting}={found.group(1)}"]))


@pytest.mark.parametrize("template", [TEXT, "llm_sft"])
def test_the_pre_flight_checks_the_rows_the_run_generates(template, tmp_path, monkeypatch):
    """The generated splits the pre-flight checks are the ones the run writes in its directory
    (same rows, same row groups), for the RL templates' warm start and the SFT template alike."""
    from vla_rl.data.prompt_dataset import PromptFile
    from vla_rl.workflows import text_assets

    def rows(path) -> tuple[list, int]:
        file = PromptFile(path)
        return [row for batch in file.iter_rows(extra_columns=("extra_info.answer",)) for row in batch], \
            pq.ParquetFile(path).num_row_groups

    checked, write = {}, text_assets.write_generated_prompts

    def write_and_keep(config, out_dir):
        paths = write(config, out_dir)
        checked.update({split: rows(path) for split, path in paths.items()})
        return paths

    config = load_template(template, []).config
    monkeypatch.setattr(text_assets, "write_generated_prompts", write_and_keep)
    preflight(load_template(template, []))
    monkeypatch.undo()
    assets = text_assets.ensure_text_assets(config, tmp_path)
    assert set(checked) == {"train", "test"}
    assert checked["train"] == rows(assets.train_file) and checked["test"] == rows(assets.test_file)
    assert len(checked["train"][0]) == config.text.num_generated_train


def test_good_vla_checkpoint_passes(assets, capsys):
    preflight(load_template(VLA, [*VLA_FROM_DIR, f"policy.config.model_path={assets.vla}"]))
    assert main(["plan", VLA, *VLA_FROM_DIR, f"policy.config.model_path={assets.vla}"]) == 0
    assert "plan 'embodied_grpo_oft_lift'" in capsys.readouterr().out


@pytest.mark.parametrize("model", ["text model directory", "generated tiny text model", "OFT checkpoint",
                                   "OFT preset"])
def test_a_lora_target_the_model_lacks_is_refused_before_anything_starts(model, assets, tmp_path, capsys):
    """Before, a listed name beside a valid one (v_prj beside q_proj) trained fewer adapters than
    asked for, silently, and a list naming no layer stopped every worker after it had loaded the
    model, with a Ray traceback (the generated tiny model: in one line, once Ray had started)."""
    template, overrides = {"text model directory": (TEXT, [f"text.model_path={assets.lm}"]),
                           "generated tiny text model": (TEXT, []),
                           "OFT checkpoint": (VLA, [*VLA_FROM_DIR, f"policy.config.model_path={assets.vla}"]),
                           "OFT preset": (VLA, [])}[model]
    typo = [*overrides, "policy.lora.rank=4", "policy.lora.target_modules=[q_proj,v_prj]"]
    with pytest.raises(PreflightError, match=r"\['v_prj'\] name no trainable linear layer of the policy; its linear "
                                             r"layers are named \[.*'q_proj'.*'v_proj'"):
        preflight(load_template(template, typo))
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, [template, *typo], "policy.lora.target_modules", "v_prj")
    preflight(load_template(template, [*overrides, "policy.lora.rank=4", "policy.lora.target_modules=[q_proj,v_proj]"]))
    preflight(load_template(template, [*overrides, "policy.lora.rank=4"]))  # the default list


@pytest.mark.parametrize(("model", "entry"), [("text model directory", "model.lm_hed"),
                                              ("OFT checkpoint", "vla.projectr"), ("OFT preset", "proprio_projectr")])
def test_a_lora_trainable_module_the_policy_lacks_is_refused_before_anything_starts(model, entry, assets, tmp_path,
                                                                                     capsys):
    """It stopped every worker after it had loaded the model (one line since d84886d, a Ray
    traceback before)."""
    template, overrides = {"text model directory": (TEXT, [f"text.model_path={assets.lm}"]),
                           "OFT checkpoint": (VLA, [*VLA_FROM_DIR, f"policy.config.model_path={assets.vla}"]),
                           "OFT preset": (VLA, [])}[model]
    typo = [*overrides, "policy.lora.rank=4", f"policy.lora.trainable_modules=[{entry}]"]
    with pytest.raises(PreflightError, match=f"the policy has no submodule '{entry}'; its submodules are"):
        preflight(load_template(template, typo))
    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, [template, *typo], "policy.lora.trainable_modules", entry)
    right = entry.replace("_hed", "_head").replace("projectr", "projector")
    preflight(load_template(template, [*overrides, "policy.lora.rank=4", f"policy.lora.trainable_modules=[{right}]"]))


def test_good_pi0_checkpoint_passes_and_loads(assets, capsys):
    from policies.pi0.policy_pi0 import PI0Policy

    overrides = [*PI0_FROM_DIR, f"policy.config.model_path={assets.pi0}"]
    for extra in ([], [f"policy.config.tokenizer_path={assets.pi0}"]):
        preflight(load_template(PI0, [*overrides, *extra]))
    assert main(["plan", PI0, *overrides]) == 0
    assert "plan 'embodied_grpo_pi0_lift'" in capsys.readouterr().out
    policy = PI0Policy(load_template(PI0, overrides).config.policy.policy_config())  # what passed loads
    assert policy.action_statistics is not None  # from the checkpoint's norm_stats.json


def test_chat_template_kwargs_reach_the_workers_policy_and_the_prompt_length_check(assets, tmp_path):
    """text.chat_template_kwargs (Qwen3's enable_thinking: false adds an empty think block to
    every prompt): the pre-flight counts prompts as the workers' policy renders them."""

    from vla_rl.workflows.text import causal_lm_policy

    lm = copy_dir(assets.lm, tmp_path / "thinking")
    template = (lm / "chat_template.jinja").read_text()
    generation_prompt = "{% if add_generation_prompt %}<|im_start|>assistant\n"
    assert generation_prompt in template
    (lm / "chat_template.jinja").write_text(template.replace(generation_prompt, generation_prompt + (
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}")))
    base = [f"text.model_path={lm}", f"text.train_file={assets.train}", f"text.test_file={assets.test}"]
    no_thinking = "text.chat_template_kwargs.enable_thinking=false"
    config = load_template(TEXT, [*base, no_thinking]).config
    rendered = causal_lm_policy(config, lm).processor.render_prompt([{"role": "user", "content": "What is 2 + 3?"}])
    assert rendered.endswith("<think>\n\n</think>\n\n")

    def longest(*overrides: str) -> int:
        with pytest.raises(PreflightError, match="text.max_prompt_length") as error:
            preflight(load_template(TEXT, [*base, "text.max_prompt_length=1", *overrides]))
        return int(re.search(r"the longest, row \d+, has (\d+)", str(error.value)).group(1))

    plain, thinking = longest(), longest(no_thinking)
    assert thinking > plain
    preflight(load_template(TEXT, [*base, f"text.max_prompt_length={plain}"]))
    with pytest.raises(PreflightError, match=f"has {thinking}"):
        preflight(load_template(TEXT, [*base, f"text.max_prompt_length={plain}", no_thinking]))
