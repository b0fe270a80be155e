"""What π0 reads from an openpi checkpoint as openpi does: the prompt's tokens (the "\\n" start of
answer tokenised on its own) and the normalisation of its ``norm_stats.json`` (mean/std)."""

from __future__ import annotations

import functools
import json

import pytest
from tokenizers import Tokenizer, models, processors, trainers
from transformers import PreTrainedTokenizerFast

from policies import make_policy
from policies.pi0 import PI0PolicyConfig
from policies.pi0.checkpoint_pi0 import save_pi0_checkpoint
from policies.pi0.processor_pi0 import PI0ObservationProcessor
from tests.policies.pi0_helpers import ACTION_DIM, PROPRIO_DIM, tiny_config


def merging_tokenizer() -> PreTrainedTokenizerFast:
    """A BPE tokenizer without pre-tokenisation trained on prompts that end in a newline: it learns
    tokens that span the text's last letters and the newline (as SentencePiece vocabularies can)."""
    tokenizer = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<pad>", "<bos>", "<eos>"], show_progress=False)
    tokenizer.train_from_iterator(["lift the cube\n", "open the door\n"] * 50, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")


def test_the_newline_is_its_own_token_as_in_openpi():
    """openpi's PaligemmaTokenizer: encode(text, add_bos=True) + encode("\\n"). One call on
    text + "\\n" gave this vocabulary's merged "cube\\n"-like tokens instead."""
    tokenizer = merging_tokenizer()
    merged = tokenizer("lift the cube\n")["input_ids"]
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    assert merged[-len(newline):] != newline  # the vocabulary does merge across the newline
    ids = PI0ObservationProcessor(tokenizer, ("agentview",), None, 28, 48).prompt_ids("lift_the cube ")
    assert ids == tokenizer("lift the cube")["input_ids"] + newline  # openpi's cleaning, then its two calls
    assert ids[0] == tokenizer.bos_token_id and ids.count(tokenizer.bos_token_id) == 1


def test_openpis_statistics_are_read_with_openpis_normalisation_only(tmp_path):
    """openpi's norm_stats.json holds mean, std, q01 and q99; openpi trains π0 with mean/std. Read
    with the default bounds_q99 it used to normalise with the quantiles, silently."""
    directory = save_pi0_checkpoint(make_policy("pi0", tiny_config(seed=3)).model, tmp_path / "pi0")
    make_policy("pi0", tiny_config()).tokenizer.save_pretrained(str(directory))
    entry = {"mean": [0.5] * 6, "std": [2.0] * 6, "q01": [-1.0] * 6, "q99": [1.0] * 6}
    (directory / "norm_stats.json").write_text(json.dumps({"norm_stats": {"actions": entry, "state": entry}}))
    config = functools.partial(PI0PolicyConfig, model_path=str(directory), action_dim=ACTION_DIM,
                               proprio_dim=PROPRIO_DIM)
    with pytest.raises(ValueError, match=r"openpi trains π0 with mean/std.*normalization=mean_std"):
        make_policy("pi0", config())
    loaded = make_policy("pi0", config(normalization="mean_std"))
    assert loaded.action_statistics.std.tolist() == [2.0] * ACTION_DIM
    given = {"action_statistics": {"q01": [-2.0] * ACTION_DIM, "q99": [2.0] * ACTION_DIM},
             "proprio_statistics": {"q01": [-2.0] * PROPRIO_DIM, "q99": [2.0] * PROPRIO_DIM}}
    assert make_policy("pi0", config(**given)).action_statistics.q99.tolist() == [2.0] * ACTION_DIM  # given, not read
