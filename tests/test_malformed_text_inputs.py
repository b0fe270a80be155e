"""Malformed inputs of the text workflow (issue 29): model directories that name custom code
(``auto_map``), damaged GGUF files, rows whose ``data_source`` has no verifier, prompts longer
than ``text.max_prompt_length``, and supervised targets that are null or too long. Each is refused before anything starts, with a PreflightError
naming the config field and the file, and through the command line with exit status 2, one line,
no traceback and nothing written. The custom code of a model directory never runs: not in the
pre-flight, not in the loaders, not through ``vla-rl train`` answering "y" on stdin.
(The other malformed prompt files and checkpoints: tests/test_preflight.py.)"""

from __future__ import annotations

import ast
import json
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_refusals import assert_cli_refuses_and_writes_nothing

from vla_rl.dag.loader import load_template
from vla_rl.preflight import PreflightError, preflight

# The arithmetic splits that text runs generate: written once per session (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("generated_prompts_once")

REPO = Path(__file__).resolve().parents[1]
TEXT = "llm_grpo"
#: The command line as installed (the console script beside the interpreter), else its module.
VLA_RL = ([str(Path(sys.executable).with_name("vla-rl"))] if Path(sys.executable).with_name("vla-rl").is_file()
          else [sys.executable, "-m", "vla_rl.cli"])
#: The file the custom code of the test model directories writes when it is imported.
MARKER = "custom_code_ran"
#: A model directory's own code: writes MARKER on import, then defines what auto_map names.
EVIL_MODULE = '''
from pathlib import Path

Path({marker!r}).write_text("the model directory's code ran")

from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer


class EvilConfig(Qwen2Config):
    model_type = "evil_qwen2"


class EvilModel(Qwen2ForCausalLM):
    config_class = EvilConfig


class EvilTokenizer(Qwen2Tokenizer):
    pass
'''


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


@dataclass(frozen=True)
class Assets:
    """Good inputs that the cases copy and damage."""

    lm: Path  # tiny Qwen2 checkpoint
    gguf: Path  # the same model as a GGUF file (float32 tensors, its tokenizer, a chat template)
    train: Path  # generated arithmetic prompts, row groups of 16
    test: Path


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_lm_dir) -> Assets:
    from vla_rl.data.arithmetic import write_arithmetic_dataset

    root = tmp_path_factory.mktemp("text_inputs")
    files = write_arithmetic_dataset(root / "prompts", 200, 64, row_group_size=16)
    gguf = write_tiny_gguf(Path(tiny_lm_dir), root / "gguf" / "tiny.gguf")
    return Assets(Path(tiny_lm_dir), gguf, files["train"], files["test"])


# ------------------------------------------------------------------------------------ helpers

#: GGUF names of the tiny Qwen2's tensors (llama.cpp's, as its convert_hf_to_gguf.py writes them).
_GGUF_TENSORS = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                 "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
                 "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def write_tiny_gguf(lm: Path, path: Path, chat_template: bool = True, tensors: bool = True) -> Path:
    """The tiny Qwen2 checkpoint ``lm`` as a GGUF file (float32), with its byte-level BPE
    tokenizer as llama.cpp stores one (``gpt2`` model, tokens, merges, special ids)."""
    import gguf
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    config = json.loads((lm / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(lm, local_files_only=True, trust_remote_code=False)
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    merges = json.loads((lm / "tokenizer.json").read_text())["model"]["merges"]
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen2")
    writer.add_token_list([token for token, _ in vocab])
    special = set(tokenizer.all_special_ids)
    writer.add_token_types([3 if index in special else 1 for _, index in vocab])
    writer.add_token_merges([" ".join(merge) if isinstance(merge, list) else merge for merge in merges])
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    if chat_template:
        writer.add_chat_template(tokenizer.chat_template)
    for name, array in (load_file(lm / "model.safetensors").items() if tensors else ()):
        if name == "model.embed_tokens.weight":
            gguf_name = "token_embd.weight"
        elif name == "model.norm.weight":
            gguf_name = "output_norm.weight"
        else:  # model.layers.<i>.<module>.<weight|bias>
            _, _, layer, *module, kind = name.split(".")
            gguf_name = f"blk.{layer}.{_GGUF_TENSORS['.'.join(module)]}.{kind}"
        writer.add_tensor(gguf_name, array.astype("float32"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rows(n: int = 40) -> list[dict]:
    """``n`` rows in the verl format (with ``extra_info.answer`` for the SFT warm start)."""
    return [{"prompt": [{"role": "user", "content": f"What is {i} + 1?"}], "data_source": "vla_rl/arithmetic",
             "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
             "extra_info": {"answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"}} for i in range(n)]


def changed(table_rows: list[dict], **by_row: dict) -> list[dict]:
    """``table_rows`` with row ``int(key[1:])`` (keys ``r<index>``) updated by its dict."""
    out = [dict(row) for row in table_rows]
    for key, update in by_row.items():
        out[int(key[1:])].update(update)
    return out


def long_prompt(additions: int) -> dict:
    return {"prompt": [{"role": "user", "content": "What is " + " + ".join(["12"] * additions) + "?"}]}


def parquet(path: Path, table_rows: list[dict], row_group_size: int = 4) -> Path:
    pq.write_table(pa.Table.from_pylist(table_rows), path, row_group_size=row_group_size)
    return path


def jsonl(path: Path, table_rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in table_rows))
    return path


def with_custom_code(directory: Path, marker: Path, auto_maps: dict[str, object],
                     model_type: str | None = None) -> Path:
    """Add ``auto_map`` entries to the configuration files of a model directory (``{file:
    auto_map}``; a missing file is created) and the modules they name, which write ``marker``
    when imported. Returns the first file."""
    for name, auto_map in auto_maps.items():
        path = directory / name
        data = json.loads(path.read_text()) if path.exists() else {}
        data["auto_map"] = auto_map
        if model_type is not None and name == "config.json":
            data["model_type"] = model_type
        path.write_text(json.dumps(data))
        references = auto_map.values() if isinstance(auto_map, dict) else [auto_map]
        for reference in references:
            for entry in reference if isinstance(reference, list) else [reference]:
                if entry is not None:
                    (directory / f"{entry.split('.')[0]}.py").write_text(EVIL_MODULE.format(marker=str(marker)))
    return directory / next(iter(auto_maps))


# ----------------------------------------------------------------------------- the cases


@dataclass(frozen=True)
class Case:
    """A malformed input: ``make(tmp, assets) -> (overrides, offending path)``; the error must name
    ``field`` and the offending path and match ``match``."""

    name: str
    make: Callable[[Path, Assets], tuple[list[str], Path]]
    field: str
    match: str
    template: str = TEXT


def custom_code(auto_maps: dict[str, object], model_type: str | None = None):
    def make(tmp: Path, assets: Assets):
        directory = shutil.copytree(assets.lm, tmp / "lm")
        return [f"text.model_path={directory}"], with_custom_code(directory, tmp / MARKER, auto_maps, model_type)
    return make


def gguf_file(make_bytes: Callable[[Assets], bytes], in_directory: bool = False):
    """A damaged GGUF file, given as ``text.model_path`` (or as ``text.gguf_file`` of a directory)."""
    def make(tmp: Path, assets: Assets):
        directory = tmp / "gguf"
        directory.mkdir()
        path = directory / "model.gguf"
        path.write_bytes(make_bytes(assets))
        if in_directory:
            return [f"text.model_path={directory}", "text.gguf_file=model.gguf"], path
        return [f"text.model_path={path}"], path
    return make


def written_gguf(**options):
    def make(tmp: Path, assets: Assets):
        path = write_tiny_gguf(assets.lm, tmp / "gguf" / "model.gguf", **options)
        return [f"text.model_path={path}"], path
    return make


def train_file(make_file: Callable[[Path, Assets], Path], *extra: str):
    def make(tmp: Path, assets: Assets):
        path = make_file(tmp, assets)
        return [f"text.train_file={path}", *(item.format(assets=assets) for item in extra)], path
    return make


def held_out_file(make_file: Callable[[Path, Assets], Path], *extra: str):
    def make(tmp: Path, assets: Assets):
        path = make_file(tmp, assets)
        return [f"text.train_file={assets.train}", f"text.test_file={path}",
                *(item.format(assets=assets) for item in extra)], path
    return make


def _random(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def _truncated(fraction: float):
    def make(assets: Assets) -> bytes:
        data = assets.gguf.read_bytes()
        return data[: int(len(data) * fraction)]
    return make


EVIL_CONFIG = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}

CASES = [
    # 1. custom code named by a model directory
    Case("auto_map in config.json (an unknown model_type)", custom_code({"config.json": EVIL_CONFIG}, "evil_qwen2"),
         "text.model_path", r"config\.json: auto_map names custom code \(AutoConfig -> configuration_evil\.EvilConfig, "
         r"and 1 more\); vla-rl never runs code from a model directory"),
    Case("auto_map in config.json (a known model_type)",
         custom_code({"config.json": {"AutoModelForCausalLM": "modeling_evil.EvilModel"}}), "text.model_path",
         r"config\.json: auto_map names custom code \(AutoModelForCausalLM -> modeling_evil\.EvilModel\)"),
    Case("auto_map in tokenizer_config.json",
         custom_code({"tokenizer_config.json": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}),
         "text.model_path", r"tokenizer_config\.json: auto_map names custom code \(AutoTokenizer -> "
         r"tokenization_evil\.EvilTokenizer\)"),
    Case("legacy list auto_map in tokenizer_config.json",
         custom_code({"tokenizer_config.json": ["tokenization_evil.EvilTokenizer", None]}), "text.model_path",
         r"auto_map names custom code \(AutoTokenizer -> tokenization_evil\.EvilTokenizer\)"),
    Case("auto_map in processor_config.json",
         custom_code({"processor_config.json": {"AutoProcessor": "processing_evil.EvilProcessor"}}), "text.model_path",
         r"processor_config\.json: auto_map names custom code \(AutoProcessor -> processing_evil\.EvilProcessor\)"),
    Case("auto_map in preprocessor_config.json",
         custom_code({"preprocessor_config.json": {"AutoImageProcessor": "image_processing_evil.EvilProcessor"}}),
         "text.model_path", r"preprocessor_config\.json: auto_map names custom code \(AutoImageProcessor"),
    # 4. damaged GGUF files
    Case("gguf: magic bytes, then random bytes", gguf_file(lambda a: b"GGUF" + _random(0, 4096)), "text.model_path",
         r"model\.gguf: a damaged or truncated GGUF file \(the gguf reader: .*version \d+ which we cannot handle"),
    Case("gguf: version 3, then random bytes", gguf_file(lambda a: b"GGUF" + struct.pack("<I", 3) + _random(1, 4096)),
         "text.model_path", r"model\.gguf: a damaged or truncated GGUF file \(the gguf reader: "),
    Case("gguf: version 1", gguf_file(lambda a: b"GGUF" + struct.pack("<IQQ", 1, 0, 0), in_directory=True),
         "text.gguf_file", r"model\.gguf: a damaged or truncated GGUF file \(the gguf reader: .*version 1 which we "
         "cannot handle"),
    Case("gguf: truncated in its metadata", gguf_file(lambda a: a.gguf.read_bytes()[:3000], in_directory=True),
         "text.gguf_file", r"model\.gguf: a damaged or truncated GGUF file \(the gguf reader: "),
    Case("gguf: truncated in its tensor data", gguf_file(_truncated(0.9)), "text.model_path",
         r"model\.gguf: a damaged or truncated GGUF file \(the gguf reader: "),
    Case("gguf: header only", gguf_file(lambda a: a.gguf.read_bytes()[:20_000], in_directory=True), "text.gguf_file",
         "a damaged or truncated GGUF file"),
    Case("gguf: a vocabulary without tensors", written_gguf(tensors=False), "text.model_path",
         "the GGUF file holds no tensors"),
    Case("gguf: no chat template for chat prompts", written_gguf(chat_template=False), "text.model_path",
         "no chat template.*text.prompt_format: raw"),
    # 5. rows whose data_source has no verifier
    Case("unknown data_source in a parquet row",
         train_file(lambda t, a: parquet(t / "u.parquet", changed(rows(), r13={"data_source": "my_org/riddles"})),
                    "text.model_path={assets.lm}"),
         "text.train_file", r"u\.parquet: row 13 has data_source 'my_org/riddles', which no verifier serves "
         r"\(known: .*openai/gsm8k.*vla_rl/arithmetic\); .*register_verifier"),
    Case("unknown data_source in a jsonl line",
         train_file(lambda t, a: jsonl(t / "u.jsonl", changed(rows(), r31={"data_source": "GSM8K"}))),
         "text.train_file", r"u\.jsonl: row 31 has data_source 'GSM8K', which no verifier serves"),
    Case("unknown data_source in the test file",
         held_out_file(lambda t, a: parquet(t / "test.parquet", changed(rows(64), r2={"data_source": "mmlu"}), 16)),
         "text.test_file", r"test\.parquet: row 2 has data_source 'mmlu'"),
    # 6. prompts longer than text.max_prompt_length
    Case("prompt too long for the generated model",
         train_file(lambda t, a: parquet(t / "l.parquet", changed(rows(), r9=long_prompt(20)))), "text.train_file",
         r"l\.parquet: 1 of 40 prompts are longer than text.max_prompt_length=48 tokens after the chat template; "
         r"the longest, row 9, has \d+: raise text.max_prompt_length to \d+ or filter"),
    Case("prompts too long for the model, raw text",
         train_file(lambda t, a: jsonl(t / "l.jsonl", changed(rows(), r3=long_prompt(12), r20=long_prompt(30))),
                    "text.model_path={assets.lm}", "text.prompt_format=raw"), "text.train_file",
         r"2 of 40 prompts are longer than text.max_prompt_length=48 tokens as raw text; the longest, row 20, has"),
    Case("prompt too long for the GGUF model's tokenizer",
         train_file(lambda t, a: parquet(t / "l.parquet", changed(rows(), r39=long_prompt(25))),
                    "text.model_path={assets.gguf}"), "text.train_file", r"the longest, row 39, has \d+"),
    Case("evaluated prompt too long in the test file",
         held_out_file(lambda t, a: parquet(t / "test.parquet", changed(rows(64), r17=long_prompt(20)), 16),
                   "text.model_path={assets.lm}"), "text.test_file",
         r"test\.parquet: 1 of 64 prompts are longer .*row 17"),
    Case("prompts too long for the SFT template",
         train_file(lambda t, a: parquet(t / "l.parquet", changed(rows(64), r5=long_prompt(20), r50=long_prompt(20)),
                                         8)),
         "text.train_file", "2 of 64 prompts.*the longest, row 5,", template="llm_sft"),
    # 7. supervised targets (text.sft_response_column) that cannot be trained on
    Case("a null SFT target (a row of another dataset mixed in)",
         train_file(lambda t, a: parquet(t / "n.parquet", changed(rows(64), r37={"extra_info": {"answer": None}}), 8)),
         "text.train_file", r"n\.parquet: row 37 has a null 'extra_info\.answer'", template="llm_sft"),
    Case("a null SFT target of the warm start, jsonl",
         train_file(lambda t, a: jsonl(t / "n.jsonl", changed(rows(), r4={"extra_info": {"answer": None}})),
                    "text.sft_steps=10"), "text.train_file", r"n\.jsonl: row 4 has a null 'extra_info\.answer'"),
    Case("SFT targets longer than text.max_response_length",
         train_file(lambda t, a: parquet(t / "t.parquet", rows(64), 8), "text.sft_steps=10",
                    "text.max_response_length=4"), "text.train_file",
         r"t\.parquet: 64 supervised targets \('extra_info\.answer'\) are longer than text\.max_response_length=4 "
         r"tokens with their end-of-turn token; the longest, row \d+, has \d+: raise"),
]


def test_the_table_covers_every_item():
    assert len({case.name for case in CASES}) == len(CASES) >= 20


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_malformed_text_input_is_refused_before_anything_starts(case, assets, tmp_path, capsys):
    overrides, offending = case.make(tmp_path, assets)
    with pytest.raises(PreflightError, match=case.match) as raised:
        preflight(load_template(case.template, overrides))
    error = raised.value
    assert error.field == case.field and str(offending) in str(error), str(error)

    assert_cli_refuses_and_writes_nothing(capsys, tmp_path, [case.template, *overrides], case.field, offending)
    assert not (tmp_path / MARKER).exists()  # no code of a model directory ran


# ------------------------------------------------------------- 1. no code from a model directory


@pytest.fixture
def evil_dirs(assets, tmp_path) -> dict[str, Path]:
    """Copies of the tiny LM naming custom code: in config.json (an unknown model_type, and
    Qwen2's), and in tokenizer_config.json."""
    dirs = {}
    for name, auto_maps, model_type in (
        ("unknown_type", {"config.json": EVIL_CONFIG}, "evil_qwen2"),
        ("qwen2", {"config.json": EVIL_CONFIG}, None),
        ("tokenizer", {"tokenizer_config.json": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}, None),
    ):
        dirs[name] = shutil.copytree(assets.lm, tmp_path / name)
        with_custom_code(dirs[name], tmp_path / MARKER, auto_maps, model_type)
    return dirs


def test_the_loaders_refuse_custom_code(evil_dirs, tmp_path):
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy
    from policies.causal_lm.loading import check_pretrained, load_pretrained
    from policies.checkpoint_files import load_tokenizer

    for directory in evil_dirs.values():
        for load in (check_pretrained, load_pretrained,
                     lambda path: CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(path)))):
            with pytest.raises(ValueError, match=rf"{directory}/\w+\.json: auto_map names custom code"):
                load(directory)
    with pytest.raises(ValueError, match="tokenizer_config.json: auto_map names custom code"):
        load_tokenizer(evil_dirs["tokenizer"])
    assert not (tmp_path / MARKER).exists()


def test_transformers_is_never_asked_to_run_custom_code(evil_dirs, tmp_path, monkeypatch):
    """With the refusal switched off, every transformers call still passes trust_remote_code=False:
    nothing asks on stdin (an answer "y" would run the code) and nothing runs."""
    import policies.causal_lm.loading as loading
    import policies.checkpoint_files as checkpoint_files

    asked = []
    monkeypatch.setattr("builtins.input", lambda prompt="": asked.append(prompt) or "y")
    monkeypatch.setattr(loading, "refuse_custom_code", lambda *args, **kwargs: None)
    monkeypatch.setattr(checkpoint_files, "refuse_custom_code", lambda *args, **kwargs: None)
    with pytest.raises(ValueError, match="not a usable model config"):
        loading.check_pretrained(evil_dirs["unknown_type"])
    with pytest.raises(ValueError):
        loading.load_pretrained(evil_dirs["unknown_type"])
    for name in ("qwen2", "tokenizer"):  # transformers' own classes load; the directory's code does not run
        loading.check_pretrained(evil_dirs[name])
        model, tokenizer = loading.load_pretrained(evil_dirs[name])
        assert type(model).__name__ == "Qwen2ForCausalLM" and type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert asked == [] and not (tmp_path / MARKER).exists()


def test_custom_code_never_runs_through_the_command_line(evil_dirs, tmp_path):
    """The issue's command, answering "y" on stdin: exit 2, one line naming auto_map, nothing ran."""
    runs = tmp_path / "runs"
    for directory in evil_dirs.values():
        result = subprocess.run(
            [*VLA_RL, "train", TEXT, "text.sft_steps=0", "trainer.total_steps=1", f"text.model_path={directory}",
             f"run.output_dir={runs}"],
            input="y\n", capture_output=True, text=True, timeout=300, cwd=tmp_path)
        errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
        assert result.returncode == 2, result.stderr
        assert len(errors) == 1 and "text.model_path" in errors[0] and "auto_map names custom code" in errors[0]
        assert "Traceback" not in result.stderr and "custom code?" not in result.stdout + result.stderr
    assert not (tmp_path / MARKER).exists() and not runs.exists()


#: Calls that load from a directory and take ``trust_remote_code`` (on any transformers class).
_LOADING_CALLS = {"from_pretrained", "from_config"}


def test_every_transformers_load_passes_trust_remote_code_false():
    """policies/, vla_rl/ and simulators/: every ``X.from_pretrained(...)`` / ``X.from_config(...)``
    of a class imported from transformers says ``trust_remote_code=False``."""
    unsafe = []
    for path in sorted(p for folder in ("policies", "vla_rl", "simulators") for p in (REPO / folder).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                    and (node.module or "").split(".")[0] == "transformers" for alias in node.names}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _LOADING_CALLS and isinstance(node.func.value, ast.Name)
                    and node.func.value.id in imported):
                continue
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            value = keywords.get("trust_remote_code")
            if not (isinstance(value, ast.Constant) and value.value is False):
                unsafe.append(f"{path.relative_to(REPO)}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    assert not unsafe, unsafe


def test_a_vla_config_with_auto_map_is_read_as_data(tmp_path):
    """OpenVLA's published config.json maps AutoConfig and AutoModelForVision2Seq to its own code;
    the VLA loader reads config.json as JSON (nothing of it runs, so it loads), and refuses custom
    code only where transformers would build a class: the tokenizer."""
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    vla_template = "embodied_grpo_oft_lift"
    from_dir = ["policy.config.architecture=null", "policy.config.proprio_dim=null"]
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(architecture={"preset": "tiny", "image_size": 56},
                                                     cameras=["agentview"]))
    vla = policy.save_pretrained(tmp_path / "vla")
    with_custom_code(vla, tmp_path / MARKER, {"config.json": {
        "AutoConfig": "configuration_prismatic.OpenVLAConfig",
        "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction"}})
    preflight(load_template(vla_template, [*from_dir, f"policy.config.model_path={vla}"]))
    OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(vla), cameras=["agentview"]))

    tokenizer_config = with_custom_code(vla, tmp_path / MARKER, {
        "tokenizer_config.json": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}})
    with pytest.raises(PreflightError, match=rf"{tokenizer_config}: auto_map names custom code \(AutoTokenizer"):
        preflight(load_template(vla_template, [*from_dir, f"policy.config.model_path={vla}"]))
    assert not (tmp_path / MARKER).exists()


# ------------------------------------------------------------------------------------ 4. GGUF


def test_a_good_gguf_passes_and_loads(assets):
    from policies.causal_lm.loading import load_pretrained
    from policies.checkpoint_files import read_gguf_header

    header = read_gguf_header(assets.gguf)
    assert header.version == 3 and header.metadata["general.architecture"] == "qwen2"
    vocab_size = json.loads((assets.lm / "config.json").read_text())["vocab_size"]
    assert header.tensors["token_embd.weight"] == (0, (64, vocab_size))  # float32, innermost dimension first
    assert header.data_end == assets.gguf.stat().st_size
    preflight(load_template(TEXT, [f"text.model_path={assets.gguf}"]))
    preflight(load_template(TEXT, [f"text.model_path={assets.gguf.parent}", f"text.gguf_file={assets.gguf.name}"]))
    model, tokenizer = load_pretrained(assets.gguf)
    assert type(model).__name__ == "Qwen2ForCausalLM" and tokenizer.chat_template is not None


def test_every_truncation_of_a_gguf_header_is_named(assets, tmp_path):
    """Cut anywhere in its header or data, the file is refused with a ValueError naming it,
    never another error from deep in a reader."""
    from policies.checkpoint_files import check_gguf_file

    data = assets.gguf.read_bytes()
    path = tmp_path / "cut.gguf"
    for size in [*range(0, 24_000, 211), *range(24_000, len(data), 9_973)]:
        path.write_bytes(data[:size])
        with pytest.raises(ValueError, match=rf"^{path}: "):
            check_gguf_file(path)


# --------------------------------------------------------- 5, 6. data sources and prompt lengths


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_the_rows_streamed_to_the_checks_are_the_rows_the_shards_read(suffix, tmp_path):
    from vla_rl.data.prompt_dataset import PromptFile

    table = changed(rows(37), r5={"data_source": "gsm8k"})
    path = parquet(tmp_path / "p.parquet", table, 5) if suffix == ".parquet" else jsonl(tmp_path / "p.jsonl", table)
    file = PromptFile(path)
    streamed = [row for batch in file.iter_rows(batch_size=8) for row in batch]
    assert [len(batch) for batch in file.iter_rows(batch_size=8)] == [8, 8, 8, 8, 5]
    assert [row.index for row in streamed] == list(range(37)) and streamed[5].data_source == "gsm8k"
    for shard in range(3):
        read = file.read_shard(shard, 3)
        assert [row.index for row in read] == file.shard_row_indices(shard, 3)
        assert read == [streamed[row.index] for row in read]


def test_prompt_length_check_counts_tokens_as_the_workers_encode_them(assets, tmp_path):
    """A prompt of exactly text.max_prompt_length tokens passes, one token more is refused: the
    limit at which the workers' processor accepts and refuses the same prompt."""
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    table = changed(rows(), r7=long_prompt(10))
    path = parquet(tmp_path / "p.parquet", table)
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(assets.lm)))
    length = len(policy.tokenizer(policy.processor.render_prompt(table[7]["prompt"]), add_special_tokens=False)
                 ["input_ids"])
    policy.processor.encode_prompts([table[7]["prompt"]], length)
    with pytest.raises(ValueError, match=f"prompt 0 has {length} tokens"):
        policy.processor.encode_prompts([table[7]["prompt"]], length - 1)
    overrides = [f"text.model_path={assets.lm}", f"text.train_file={path}", "eval.num_episodes=0"]
    preflight(load_template(TEXT, [*overrides, f"text.max_prompt_length={length}"]))
    with pytest.raises(PreflightError, match=rf"1 of 40 prompts .*=({length - 1}) .* row 7, has {length}:"):
        preflight(load_template(TEXT, [*overrides, f"text.max_prompt_length={length - 1}"]))


_PLUGIN_SOURCE = "plugin_org/riddles"


@pytest.mark.parametrize("case", ["long test prompt never evaluated", "unknown source in SFT pairs",
                                  "source registered by a plugin"])
def test_good_text_inputs_pass(case, assets, tmp_path, monkeypatch):
    if case == "long test prompt never evaluated":  # eval reads each worker's first 4 rows: rows 0-3, 16-19
        path = parquet(tmp_path / "test.parquet", changed(rows(64), r10=long_prompt(30)), 16)
        overrides = [f"text.train_file={assets.train}", f"text.test_file={path}", "eval.num_episodes=8"]
        preflight(load_template(TEXT, overrides))
        with pytest.raises(PreflightError, match="row 10"):
            preflight(load_template(TEXT, [*overrides[:2], "eval.num_episodes=64"]))
    elif case == "unknown source in SFT pairs":  # supervised pairs are never scored
        path = parquet(tmp_path / "sft.parquet", changed(rows(64), r3={"data_source": "my/pairs"}), 8)
        preflight(load_template("llm_sft", [f"text.train_file={path}", "eval.num_episodes=0"]))
    else:
        monkeypatch.syspath_prepend(str(tmp_path))
        (tmp_path / "riddle_verifier_plugin.py").write_text(
            "from vla_rl.rewards.verifiers import HASH_ANSWER_VERIFIER, VERIFIERS, register_verifier\n"
            f"if {_PLUGIN_SOURCE!r} not in VERIFIERS:\n"
            f"    register_verifier(HASH_ANSWER_VERIFIER, {_PLUGIN_SOURCE!r})\n")
        path = parquet(tmp_path / "p.parquet", changed(rows(), r0={"data_source": _PLUGIN_SOURCE}))
        preflight(load_template(TEXT, [f"text.train_file={path}", f"text.test_file={path}",
                                       "run.imports=[riddle_verifier_plugin]"]))
