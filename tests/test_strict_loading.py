"""Loading is as strict at run time as the pre-flight (vla_rl/preflight/) is before a run:
damaged or mismatched checkpoints are errors naming the file and the tensors, partial and
pickle loads only on request, raw prompts encoded as they are, and `vla-rl eval` of a run whose
checkpoint went bad refuses it in one line."""

from __future__ import annotations

import struct

import pytest
import torch
from checkpoint_inputs import (
    VLA,
    VLA_FROM_DIR,
    Assets,
    copy_dir,
    make_assets,
    rename_first_layer,
    rewrite_weights,
    to_pickle,
    truncate,
    widen,
)
from safetensors.torch import load_file

from vla_rl.cli import main
from vla_rl.dag.loader import load_template


@pytest.fixture(scope="module")
def assets(tmp_path_factory, tiny_lm_dir) -> Assets:
    return make_assets(tmp_path_factory, tiny_lm_dir)


@pytest.fixture(scope="module", autouse=True)
def _one_thread(torch_one_thread):
    """Small models on the shared machines run fastest on one thread."""


def test_causal_lm_loading_is_strict(assets, tmp_path):
    from policies.causal_lm.loading import load_pretrained

    renamed = copy_dir(assets.lm, tmp_path / "renamed")
    rewrite_weights(renamed, rename_first_layer)
    with pytest.raises(ValueError, match=rf"{renamed}: the weights do not match .*12 missing \(model\.layers\.0\."):
        load_pretrained(renamed)
    model, _ = load_pretrained(renamed, allow_partial_load=True)
    assert model.model.layers[0].mlp.up_proj.weight.shape == (128, 64)

    widened = copy_dir(assets.lm, tmp_path / "widened")
    rewrite_weights(widened, widen("model.layers.0.mlp.up_proj.weight"))
    with pytest.raises(ValueError, match=r"up_proj\.weight: \(129, 64\) in the checkpoint, \(128, 64\) in the model"):
        load_pretrained(widened)

    no_tokenizer = copy_dir(assets.lm, tmp_path / "no_tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=rf"{no_tokenizer}: no usable tokenizer"):
        load_pretrained(no_tokenizer)

    pickled = copy_dir(assets.lm, tmp_path / "pickled")
    to_pickle(pickled)
    with pytest.raises(ValueError, match="pickle weights are refused"):
        load_pretrained(pickled)
    model, _ = load_pretrained(pickled, allow_pickle=True)
    reference, _ = load_pretrained(assets.lm)
    assert torch.equal(model.model.norm.weight, reference.model.norm.weight)

    truncated = copy_dir(assets.lm, tmp_path / "truncated")
    truncate(truncated / "model.safetensors", 0.6)
    with pytest.raises(ValueError, match=r"model\.safetensors: truncated"):
        load_pretrained(truncated)


def test_raw_prompts_are_encoded_as_they_are(assets, tmp_path):
    from policies.causal_lm import CausalLMConfig, CausalLMPolicy

    raw = copy_dir(assets.lm, tmp_path / "raw")
    (raw / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(raw)))
    policy = CausalLMPolicy.from_pretrained(CausalLMConfig(model_path=str(raw), prompt_format="raw",
                                                           max_prompt_length=16))
    input_ids, attention_mask = policy.processor.encode_prompts([[{"role": "user", "content": "What is 2 + 3?"}]], 16)
    expected = policy.tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    assert input_ids[0, attention_mask[0].bool()].tolist() == expected


def test_raw_prompts_get_the_special_tokens_the_tokenizer_adds(assets):
    """A tokenizer that adds a BOS (Llama's, Mistral's, Gemma's) gets it on raw prompts, as TRL
    encodes them (processing_class(text=prompts)); a chat template writes its own."""
    from tokenizers.processors import TemplateProcessing
    from transformers import AutoTokenizer

    from policies.causal_lm.processor_causal_lm import CausalLMProcessor

    tokenizer = AutoTokenizer.from_pretrained(assets.lm)
    bos = "<|im_start|>"  # stands in for a BOS token
    bos_id = tokenizer.convert_tokens_to_ids(bos)
    tokenizer.backend_tokenizer.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, bos_id)])
    prompt = [{"role": "user", "content": "What is 2 + 3?"}]
    raw = CausalLMProcessor(tokenizer, prompt_format="raw")
    input_ids, attention_mask = raw.encode_prompts([prompt], 16)
    assert input_ids[0, attention_mask[0].bool()].tolist() == tokenizer("What is 2 + 3?")["input_ids"]
    assert input_ids[0, attention_mask[0].bool()][0] == bos_id
    chat = CausalLMProcessor(tokenizer)
    input_ids, attention_mask = chat.encode_prompts([prompt], 40)
    rendered = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert input_ids[0, attention_mask[0].bool()].tolist() == tokenizer(rendered, add_special_tokens=False)["input_ids"]


def test_vla_loading_is_strict(assets, tmp_path):
    from policies.openvla_oft.configuration_openvla_oft import OpenVLAOFTPolicyConfig
    from policies.openvla_oft.modeling_openvla_oft import OpenVLAOFTPolicy

    widened = copy_dir(assets.vla, tmp_path / "widened")
    rewrite_weights(widened, widen("projector.fc1.weight"))
    with pytest.raises(ValueError, match=r"the weights do not match .*projector\.fc1\.weight"):
        OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(widened), cameras=["agentview"]))
    policy = OpenVLAOFTPolicy(OpenVLAOFTPolicyConfig(model_path=str(widened), cameras=["agentview"],
                                                     allow_partial_load=True))
    saved = load_file(assets.vla / "model.safetensors")
    assert policy.vla.projector.fc1.weight.shape == saved["projector.fc1.weight"].shape  # kept its initialisation
    assert torch.equal(policy.vla.projector.fc2.weight, saved["projector.fc2.weight"])  # the rest loaded


def test_safetensors_header_length_is_checked(tmp_path):
    from policies.checkpoint_files import read_safetensors_header

    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", 10_000) + b"{}")
    with pytest.raises(ValueError, match=rf"{path}: not a safetensors file, or a truncated one"):
        read_safetensors_header(path)


def test_eval_of_a_run_whose_pretrained_checkpoint_went_bad(assets, tmp_path, capsys):
    import yaml

    from vla_rl.checkpoints.layout import TRAINER_STATE_FILE

    broken = copy_dir(assets.vla, tmp_path / "vla")
    truncate(broken / "model.safetensors", 0.3)
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "checkpoints" / "step_00000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / TRAINER_STATE_FILE).write_text("{}")
    raw = load_template(VLA, [*VLA_FROM_DIR, f"policy.config.model_path={broken}"]).raw
    (run_dir / "template.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    assert main(["eval", str(run_dir)]) == 2
    error = capsys.readouterr().err
    assert "field 'policy.config.model_path'" in error and f"{broken / 'model.safetensors'}: truncated" in error
    assert not (run_dir / "eval").exists()
