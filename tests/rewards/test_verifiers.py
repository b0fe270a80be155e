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
        ("HuggingFaceH4/MATH-500", "\\boxed{3}", "4", Verdict("3", False)),
        ("HuggingFaceH4/MATH-500", "#### 4", "4", Verdict(None, False)),
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
    assert format_reward("lighteval/MATH", "\\boxed{12}") == 1.0
    assert format_reward("math", "\\boxed{12}") == 0.0 and format_reward("math", "Answer: 12") == 1.0


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
    sources = ["openai/gsm8k", "openai/gsm8k", "openai/gsm8k", "lighteval/MATH"]
    responses = ["#### 4", "#### 5", "4", "\\boxed{4}"]
    rewards, correct, metrics = score_responses(sources, responses, ["4"] * 4, RuleRewardConfig(format_score=0.1))
    torch.testing.assert_close(rewards, torch.tensor([1.1, 0.1, 0.0, 1.1]))
    assert rewards.dtype == torch.float32
    assert correct.dtype == torch.bool and correct.tolist() == [True, False, False, True]
    assert metrics == {"reward/accuracy": 0.5, "reward/format_rate": 0.75}
    accuracy_only, _, _ = score_responses(sources, responses, ["4"] * 4)
    torch.testing.assert_close(accuracy_only, torch.tensor([1.0, 0.0, 0.0, 1.0]))


def test_score_responses_verifies_each_response_once():
    """A verifier can take seconds (math-verify's parses); the reward node takes rewards and
    success from one verdict per response (it verified every response twice before 2026-12-03)."""
    calls = []
    counting = Verifier(extract_answer=lambda text: text.strip() or None,
                        answers_equal=lambda predicted, reference: calls.append(predicted) or predicted == reference)
    register_verifier(counting, "tests/counting")
    try:
        rewards, correct, _ = score_responses(["tests/counting"] * 3, ["a", "b", "c"], ["a", "x", "c"])
    finally:
        VERIFIERS._entries.pop("tests/counting")
    assert sorted(calls) == ["a", "b", "c"]
    assert correct.tolist() == [True, False, True] and rewards.tolist() == [1.0, 0.0, 1.0]


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
    rewards, _, metrics = score_responses([DATA_SOURCE], [response], ["6"], RuleRewardConfig(1.0, 0.5, flexible=True))
    assert float(rewards[0]) == flexible.correct + 0.5 * flexible.formatted
    assert metrics["reward/format_rate"] == float(flexible.formatted)


# verl's math_dapo.compute_score (verl/utils/reward_score/math_dapo.py, run on each case): acc
# True where the last "Answer:" line, normalised as Minerva's, is the ground truth.
VERL_MATH_DAPO = [
    ("Let me compute. Answer: 42", "42", True),
    ("So \\boxed{42}", "42", False),  # no Answer: line (verl scores -1)
    ("answer : 41\nAnswer: 42 dollars", "42", True),  # the last one, its unit removed
    ("ANSWER:7", "42", False),
    ("Answer:\n42", "42", True),
    ("Answer: $\\boxed{\\frac{1}{2}}$", "\\frac{1}{2}", True),
    ("Answer: x = 1,234", "1234", True),
]


@pytest.mark.parametrize("data_source", ["math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025"])
@pytest.mark.parametrize(("response", "ground_truth", "correct"), VERL_MATH_DAPO)
def test_the_sources_verl_scores_with_math_dapo_take_minervas_answer_line(data_source, response, ground_truth,
                                                                           correct):
    """verl's default_compute_score sends "math_dapo", "math", "math_dapo_reasoning" and every
    "aime*" source to math_dapo (Minerva's "Answer:" line); "math" was a \\boxed{} source here,
    which scored the opposite of verl's on both kinds of answer."""
    verdict = verify(data_source, response, ground_truth)
    assert verdict.correct is correct
    assert verdict.formatted is ("answer" in response.lower())


def test_minerva_answers_are_never_stricter_than_verl():
    """Equal after Minerva's normalisation (verl's criterion), or equal as numbers or symbolically."""
    assert verify("math_dapo", "Answer: 0.5", "\\frac{1}{2}").correct  # verl: False (strings differ)
    assert verify("math_dapo", "Answer: 1/2", "\\frac12").correct
    assert not verify("math_dapo", "Answer: 3", "4").correct


def test_prefixed_sources_are_known_to_the_preflight():
    from vla_rl.rewards.verifiers import known_data_sources, unknown_data_sources

    assert unknown_data_sources(["aime2024", "math", "nope", "aime2024"]) == ["nope"]
    assert "aime*" in known_data_sources()


def _last_word(text: str) -> str | None:
    return text.split()[-1] if text.split() else None


@pytest.mark.parametrize("verifier, message", [
    (Verifier(_last_word, lambda predicted, reference: float("nan")),
     r"verifier function .*<lambda> returned nan \(float\) for \('4', '4'\); it returns a bool"),
    (Verifier(lambda text: 4.0), r"verifier function .*<lambda> returned 4.0 \(float\); it returns the final answer "
                                 "as a string, or None"),
])
def test_a_verifier_returning_something_else_stops_the_run_naming_it(verifier, message):
    """A NaN from answers_equal counted as correct (torch.tensor(nan, dtype=bool) is True): a run
    reported 100% accuracy; a float answer counted as formatted."""
    from vla_rl_core.errors import RunStopped

    with pytest.raises(RunStopped, match=message):
        verifier("so 4", "4")


def test_numpy_booleans_are_verdicts():
    import numpy as np

    verdict = Verifier(_last_word, lambda predicted, reference: np.bool_(predicted == reference))("so 4", "4")
    assert verdict.correct is True and verdict.answer == "4"


def test_only_a_leading_prefix_picks_a_prefix_verifier():
    assert verify("aime_2024", "the answer is $7$\nAnswer: 7", "7").correct
    with pytest.raises(RegistryError, match="unknown text verifier"):
        verify("not_aime_2024", "Answer: 7", "7")
