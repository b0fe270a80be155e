"""Verifiers selected by data_source, the format reward and batch scoring."""

from __future__ import annotations

import pytest
import torch

from vla_rl.data.arithmetic import DATA_SOURCE
from vla_rl.rewards.verifiers import (
    VERIFIERS,
    RuleRewardConfig,
    Verdict,
    Verifier,
    format_reward,
    register_verifier,
    score_responses,
    verify,
)
from vla_rl_core.registry import RegistryError

GSM8K_SOLUTION = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"


@pytest.mark.parametrize(
    ("data_source", "response", "ground_truth", "verdict"),
    [
        ("openai/gsm8k", "48 + 24 = 72\n#### 72", "72", Verdict("72", True)),
        ("openai/gsm8k", "#### 72", GSM8K_SOLUTION, Verdict("72", True)),  # a full reference solution
        ("openai/gsm8k", "#### 71", "72", Verdict("71", False)),
        ("openai/gsm8k", "The answer is 72.", "72", Verdict(None, False)),  # right number, wrong format
        (DATA_SOURCE, "3 + 4 = 7\n#### 7", "7", Verdict("7", True)),
        ("lighteval/MATH", "so $\\boxed{\\frac{1}{2}}$", "\\frac12", Verdict("\\frac{1}{2}", True)),
        ("lighteval/MATH", "\\boxed{0.5}", "$\\boxed{\\frac{1}{2}}$", Verdict("0.5", True)),
        ("math", "\\boxed{3}", "4", Verdict("3", False)),
        ("math", "#### 4", "4", Verdict(None, False)),
    ],
)
def test_verify(data_source, response, ground_truth, verdict):
    assert verify(data_source, response, ground_truth) == verdict


def test_unknown_data_source_lists_the_known_ones():
    with pytest.raises(RegistryError, match="unknown text verifier.*'nope'.*openai/gsm8k"):
        verify("nope", "#### 1", "1")


def test_format_reward():
    assert format_reward("openai/gsm8k", "x\n#### 12") == 1.0
    assert format_reward("openai/gsm8k", "12") == 0.0
    assert format_reward("math", "\\boxed{12}") == 1.0


def test_register_verifier_for_a_new_data_source():
    exact = Verifier(extract_answer=lambda text: text.strip() or None, answers_equal=str.__eq__)
    register_verifier(exact, "tests/exact_match")
    try:
        assert verify("tests/exact_match", " Paris ", "Paris") == Verdict("Paris", True)
        with pytest.raises(RegistryError, match="already registered"):
            register_verifier(exact, "tests/exact_match")
    finally:
        VERIFIERS._entries.pop("tests/exact_match")
    with pytest.raises(ValueError, match="at least one"):
        register_verifier(exact)


def test_score_responses_sums_accuracy_and_format():
    sources = ["openai/gsm8k", "openai/gsm8k", "openai/gsm8k", "math"]
    responses = ["#### 4", "#### 5", "4", "\\boxed{4}"]
    rewards, metrics = score_responses(sources, responses, ["4"] * 4, RuleRewardConfig(format_score=0.1))
    torch.testing.assert_close(rewards, torch.tensor([1.1, 0.1, 0.0, 1.1]))
    assert rewards.dtype == torch.float32
    assert metrics == {"reward/accuracy": 0.5, "reward/format_rate": 0.75}
    accuracy_only, _ = score_responses(sources, responses, ["4"] * 4)
    torch.testing.assert_close(accuracy_only, torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_score_responses_checks_lengths():
    with pytest.raises(ValueError, match="one data_source and ground_truth per response"):
        score_responses(["gsm8k"], ["#### 1", "#### 2"], ["1", "2"])


@pytest.mark.parametrize(
    ("response", "strict", "flexible"),
    [
        ("2 + 4 = 6", Verdict(None, False), Verdict(None, True)),  # prose: only flexible finds the 6
        ("2 + 4 = 6\n#### 7", Verdict("7", False), Verdict("7", False)),  # a formatted answer wins
        ("I do not know", Verdict(None, False), Verdict(None, False)),
    ],
)
def test_flexible_extraction_judges_unformatted_answers_by_their_last_number(response, strict, flexible):
    assert verify(DATA_SOURCE, response, "6") == strict
    assert verify(DATA_SOURCE, response, "6", flexible=True) == flexible
    rewards, metrics = score_responses([DATA_SOURCE], [response], ["6"], RuleRewardConfig(1.0, 0.5, flexible=True))
    assert float(rewards[0]) == flexible.correct + 0.5 * flexible.formatted
    assert metrics["reward/format_rate"] == float(flexible.formatted)
