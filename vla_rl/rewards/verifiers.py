"""Rule-based rewards for text tasks: a verifier per ``data_source``, and the reward they make.

A :class:`Verifier` extracts the final answer from a decoded response in its data source's format
and compares it with the row's ``reward_model.ground_truth``. Verifiers are registered by the
``data_source`` names they serve, as verl's ``default_compute_score`` dispatches on
``data_source``::

    register_verifier(Verifier(extract_answer=my_extractor), "my_org/my_dataset")

The reward of a response (:func:`score_responses`) is ``correct_score`` if its answer is correct
plus ``format_score`` if its answer is in the expected format (DeepSeek-R1's accuracy + format
rewards, summed as TRL sums reward functions); with ``format_score = 0`` it is plain accuracy.

Answer extraction is ``strict`` (only an answer in the data source's format counts, verl's GSM8K
default) or ``flexible`` (a response without that format is judged by its fallback answer, e.g.
its last number: verl's ``method="flexible"`` and lm-eval's GSM8K "flexible-extract"), which
lets an instruct model that answers in prose earn the accuracy reward while the format reward
still asks for the format.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from vla_rl.rewards.math_answers import (
    answers_equal,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    extract_minerva_answer,
    minerva_answers_equal,
)
from vla_rl_core.errors import RunStopped
from vla_rl_core.registry import Registry

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Verdict:
    """What a verifier found in one response.

    Attributes:
        answer: the final answer in the data source's format (``#### 42`` → ``"42"``), or
            ``None`` if the response does not give one in that format.
        correct: the answer equals the ground truth (with flexible extraction, an unformatted
            response's fallback answer may be correct while ``answer`` is ``None``).
    """

    answer: str | None
    correct: bool

    @property
    def formatted(self) -> bool:
        """The response gives its final answer in the expected format."""
        return self.answer is not None


@dataclass(frozen=True)
class Verifier:
    """A final-answer format and an equivalence test.

    Attributes:
        extract_answer: the final answer of a text in the expected format, or ``None``.
        answers_equal: ``(predicted, reference) -> bool``; numeric, then symbolic by default.
        fallback_answer: flexible extraction's answer of a text without the format (``None``:
            flexible extraction is strict for this data source).
    """

    extract_answer: Callable[[str], str | None]
    answers_equal: Callable[[str, str], bool] = answers_equal
    fallback_answer: Callable[[str], str | None] | None = None

    def __call__(self, response: str, ground_truth: str, flexible: bool = False) -> Verdict:
        """Judge one response. A ground truth that contains a full solution in the expected
        format (a GSM8K solution ending in ``#### 72``) is reduced to its final answer first.
        With ``flexible``, a response without the format is judged by its fallback answer.

        Raises:
            RunStopped: an extraction returned something else than a string or None, or
                ``answers_equal`` something else than a bool (a NaN counted as correct, being
                truthy), naming the function.
        """
        answer = self._checked_answer(self.extract_answer, response)
        judged = answer
        if answer is None and flexible and self.fallback_answer is not None:
            judged = self._checked_answer(self.fallback_answer, response)
        if judged is None:
            return Verdict(None, False)
        reference = self._checked_answer(self.extract_answer, ground_truth) or ground_truth
        equal = self.answers_equal(judged, reference)
        if not isinstance(equal, (bool, np.bool_)):
            raise RunStopped(f"verifier function {_name(self.answers_equal)} returned {equal!r} "
                             f"({type(equal).__name__}) for ({judged!r}, {reference!r}); it returns a bool")
        return Verdict(answer, bool(equal))

    @staticmethod
    def _checked_answer(extract: Callable[[str], str | None], text: str) -> str | None:
        answer = extract(text)
        if answer is not None and not isinstance(answer, str):
            raise RunStopped(f"verifier function {_name(extract)} returned {answer!r} ({type(answer).__name__}); it "
                             "returns the final answer as a string, or None when the text gives none")
        return answer

    def formatted(self, response: str) -> bool:
        """Whether the response gives a final answer in the expected format."""
        return self.extract_answer(response) is not None


VERIFIERS: Registry[Verifier] = Registry("text verifier (data_source)")


def register_verifier(verifier: Verifier, *data_sources: str) -> Verifier:
    """Register ``verifier`` for each of ``data_sources``; returns it.

    Raises:
        vla_rl_core.registry.RegistryError: a data source already has a verifier.
        ValueError: no data source given.
    """
    if not data_sources:
        raise ValueError("register_verifier needs at least one data_source name")
    for source in data_sources:
        VERIFIERS.register(source)(verifier)
    return verifier


#: GSM8K: the final answer is the number after the last ``####`` (flexible: the last number).
HASH_ANSWER_VERIFIER = register_verifier(
    Verifier(extract_hash_answer, fallback_answer=extract_last_number), "openai/gsm8k", "gsm8k", "vla_rl/arithmetic"
)
#: MATH: the final answer is the content of the last ``\boxed{}``, compared symbolically.
BOXED_ANSWER_VERIFIER = register_verifier(
    Verifier(extract_boxed), "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"
)
#: DAPO-Math and AIME: Minerva's ``Answer: ...`` line, normalised as Minerva's; the data sources
#: verl's ``default_compute_score`` sends to ``math_dapo.compute_score`` (``"math"`` among them;
#: every ``aime*`` source too: :data:`PREFIX_VERIFIERS`).
MINERVA_ANSWER_VERIFIER = register_verifier(
    Verifier(extract_minerva_answer, answers_equal=minerva_answers_equal), "math_dapo", "math", "math_dapo_reasoning"
)
#: Verifiers of every data source whose name starts with the key (verl's ``startswith("aime")``).
PREFIX_VERIFIERS: dict[str, Verifier] = {"aime": MINERVA_ANSWER_VERIFIER}


def _verifier(data_source: str) -> Verifier:
    """The verifier of ``data_source``: its registered one, else the one of its name's prefix.

    Raises:
        vla_rl_core.registry.RegistryError: neither (the message lists the known data sources).
    """
    if data_source not in VERIFIERS:
        for prefix, verifier in PREFIX_VERIFIERS.items():
            if data_source.startswith(prefix):
                return verifier
    return VERIFIERS.get(data_source)


def unknown_data_sources(data_sources: Sequence[str]) -> list[str]:
    """The entries of ``data_sources`` that no verifier serves, in order, each once (the run's
    pre-flight checks every prompt row's ``data_source`` with it)."""
    return [source for source in dict.fromkeys(data_sources)
            if source not in VERIFIERS and not source.startswith(tuple(PREFIX_VERIFIERS))]


def known_data_sources() -> list[str]:
    """The data sources that have a verifier and the prefixes that serve any name starting with
    them (``aime*``), sorted."""
    return sorted([str(name) for name in VERIFIERS.names()] + [f"{prefix}*" for prefix in PREFIX_VERIFIERS])


def verify(data_source: str, response: str, ground_truth: str, flexible: bool = False) -> Verdict:
    """The verdict of ``data_source``'s verifier on one response (``flexible``: see the module
    docstring).

    Raises:
        vla_rl_core.registry.RegistryError: no verifier serves ``data_source``; the message
            lists the known data sources.
    """
    return _verifier(data_source)(response, ground_truth, flexible)


def format_reward(data_source: str, response: str) -> float:
    """1.0 if the response gives a final answer in ``data_source``'s format, else 0.0.

    Raises:
        vla_rl_core.registry.RegistryError: no verifier serves ``data_source``.
    """
    return float(_verifier(data_source).formatted(response))


@dataclass(frozen=True)
class RuleRewardConfig:
    """Weights of the rule-based reward.

    Attributes:
        correct_score: reward for a correct final answer.
        format_score: reward added for a final answer in the expected format, right or wrong
            (0: accuracy only, as verl's GSM8K default).
        flexible: flexible answer extraction (see the module docstring).
    """

    correct_score: float = 1.0
    format_score: float = 0.0
    flexible: bool = False


def score_responses(
    data_sources: Sequence[str],
    responses: Sequence[str],
    ground_truths: Sequence[str],
    config: RuleRewardConfig = RuleRewardConfig(),
) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    """Rule-based rewards of a batch of decoded responses (each verified once).

    Args:
        data_sources, responses, ground_truths: one entry per response, same length ``n``.
        config: the reward weights.

    Returns:
        ``rewards`` ``(n,)`` float32, ``correct`` ``(n,)`` bool (the final answer is right) and
        metrics: ``reward/accuracy`` and ``reward/format_rate`` (fractions of the batch).

    Raises:
        ValueError: the sequences differ in length.
        vla_rl_core.registry.RegistryError: a data source has no verifier.
    """
    import torch

    if not len(data_sources) == len(responses) == len(ground_truths):
        raise ValueError(
            f"score_responses needs one data_source and ground_truth per response, got "
            f"{len(data_sources)}, {len(responses)} and {len(ground_truths)}"
        )
    verdicts = [verify(*entry, config.flexible) for entry in zip(data_sources, responses, ground_truths)]
    correct = torch.tensor([v.correct for v in verdicts], dtype=torch.bool)
    formatted = torch.tensor([v.formatted for v in verdicts], dtype=torch.float32)
    rewards = config.correct_score * correct.float() + config.format_score * formatted
    n = max(len(verdicts), 1)
    metrics = {"reward/accuracy": float(correct.sum()) / n, "reward/format_rate": float(formatted.sum()) / n}
    return rewards, correct, metrics


def _name(function: Callable) -> str:
    """``module.qualname`` of a verifier's function, for errors."""
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', repr(function))}"
