"""Final-answer extraction and answer equivalence for maths responses.

Extraction follows the three conventions of the common datasets: GSM8K's ``#### 42`` final line,
MATH's ``\\boxed{...}`` and Minerva's ``Answer: 42`` line (DAPO-Math, AIME: verl's ``math_dapo``).
Equivalence first compares plain numbers exactly (``1,000`` = ``1000.0``,
``3/4`` = ``0.75``; no floating-point tolerance needed), which covers GSM8K-style answers in
microseconds, and hands anything else (``\\frac{\\sqrt{3}}{2}``, intervals, sets, expressions) to
`math-verify <https://github.com/huggingface/Math-Verify>`_, which parses LaTeX and compares
symbolically with sympy.
"""

from __future__ import annotations

import re
import threading
from fractions import Fraction

# verl's GSM8K marker (verl/utils/reward_score/gsm8k.py, strict): "#### " and the number's characters.
_VERL_HASH_ANSWER = re.compile(r"#### (-?[0-9.,]+)")
# the forms it misses: "#### $18", "####42", "####  7", "####\n7".
_HASH_ANSWER = re.compile(r"####\s*\$?\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")
_NUMBER = re.compile(r"-?(?:[0-9][0-9,]*(?:\.[0-9]+)?|\.[0-9]+)")
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]+)?(?:\.[0-9]+)?")
_LATEX_FRACTION = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_BOXED_COMMANDS = ("\\boxed", "\\fbox")
#: Seconds math-verify may spend parsing or comparing one answer (only enforced on the main
#: thread: math-verify's timeout uses ``signal.alarm``).
MATH_VERIFY_TIMEOUT_S = 5


def extract_hash_answer(text: str) -> str | None:
    """The number after the last ``####`` marker (GSM8K's final-answer format): the last answer
    verl's strict pattern finds (``#### `` and digits, dots, commas, a minus: ``#### .5``,
    ``#### ,12``), so that every answer verl reads is read; without one, the last of the forms it
    misses (``#### $18``, ``####42``, ``####  7``).

    Args:
        text: a response or a GSM8K reference solution.

    Returns:
        The number as written, commas and a closing full stop removed (``"#### 1,234."`` →
        ``"1234"``); ``None`` if the text has no ``#### <number>``.
    """
    verl = [m.replace(",", "").rstrip(".") for m in _VERL_HASH_ANSWER.findall(text)]
    verl = [m for m in verl if m not in ("", "-")]
    if verl:
        return verl[-1]
    matches = _HASH_ANSWER.findall(text)
    return matches[-1].replace(",", "") if matches else None


def extract_last_number(text: str) -> str | None:
    """The last number in the text, commas removed; ``None`` if there is none.

    The lenient extraction of verl's GSM8K scorer (``method="flexible"``).
    """
    matches = [m for m in _NUMBER.findall(text) if m not in ("-", ".")]
    return matches[-1].replace(",", "") if matches else None


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces matched.

    Also accepts the brace-less ``\\boxed 5`` form (up to the next whitespace or ``$``).

    Returns:
        The content without the command and outer braces, stripped; ``None`` if there is no
        complete box.
    """
    start, command = max((text.rfind(command), command) for command in _BOXED_COMMANDS)
    if start < 0:
        return None
    rest = text[start + len(command) :]
    if not rest.lstrip().startswith("{"):
        bare = re.match(r"\s+([^\s$]+)", rest)  # "\boxed 5"
        return bare.group(1) if bare else None
    rest = rest.lstrip()
    depth = 0
    for i, char in enumerate(rest):
        depth += (char == "{") - (char == "}")
        if depth == 0:
            return rest[1:i].strip()
    return None


def parse_number(text: str) -> Fraction | None:
    """An exact rational from a plain written number, or ``None`` if ``text`` is not one.

    Accepts an optional sign, thousands separators, decimals, a trailing ``%`` (kept as written:
    ``"50%"`` is 50), a leading ``$``, surrounding ``$...$`` math delimiters, ``a/b`` and
    ``\\frac{a}{b}`` of plain numbers, and a trailing period. Anything else (units, words,
    symbolic expressions) gives ``None``.

    Examples:
        ``"1,234"`` → 1234; ``"-0.50"`` → -1/2; ``"\\frac{3}{4}"`` → 3/4; ``"x+1"`` → None.
    """
    text = text.strip().strip("$").strip()
    text = text.removeprefix("\\$").removeprefix("$").removesuffix("\\%").removesuffix("%").rstrip(".").strip()
    fraction = _LATEX_FRACTION.fullmatch(text)
    if fraction:
        text = f"{fraction.group(1)}/{fraction.group(2)}"
    if text.count("/") == 1:
        numerator, denominator = (parse_number(part) for part in text.split("/"))
        if numerator is None or denominator in (None, 0):
            return None
        return numerator / denominator
    if not text or not _PLAIN_NUMBER.fullmatch(text) or not any(c.isdigit() for c in text):
        return None
    return Fraction(text.replace(",", ""))


def answers_equal(predicted: str, reference: str) -> bool:
    """Whether a predicted final answer equals the reference answer.

    Plain numbers (see :func:`parse_number`) are compared exactly; if either side is not a
    plain number, math-verify decides (the reference is parsed as the gold answer). On a
    worker thread math-verify runs without its signal-based time limit.

    Args:
        predicted: the answer extracted from a response (not the whole response).
        reference: the ground truth.
    """
    predicted_number, reference_number = parse_number(predicted), parse_number(reference)
    if predicted_number is not None and reference_number is not None:
        return predicted_number == reference_number
    from math_verify import (  # sympy-heavy: imported on first symbolic comparison
        parse,
        verify,
    )

    timeout = MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    gold = parse(_as_math(reference), parsing_timeout=timeout)
    target = parse(_as_math(predicted), parsing_timeout=timeout)
    if not gold or not target:
        return False
    return bool(verify(gold, target, timeout_seconds=timeout))


def _as_math(answer: str) -> str:
    """Wrap a bare answer in ``$...$`` so that math-verify's LaTeX extraction finds it."""
    answer = answer.strip()
    return answer if answer.startswith("$") or "\\boxed" in answer else f"${answer}$"


_MINERVA_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# Minerva's final-answer normalisation (Lewkowycz et al. 2022, appendix D.1), as verl's
# verl/utils/reward_score/math_dapo.py (and lm-evaluation-harness's minerva_math) write it.
_MINERVA_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_MINERVA_REMOVED = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue", "points",
    "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals", "edges", "students",
    "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3",
    "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
)


def extract_minerva_answer(text: str) -> str | None:
    """What follows the last ``Answer:`` (any case) up to the end of its line: Minerva's final
    answer, DAPO-Math's and AIME's format (verl's ``math_dapo.is_correct_minerva`` pattern).

    Returns:
        The answer, stripped, or None without an ``Answer:`` line (or with an empty one).
    """
    matches = _MINERVA_ANSWER.findall(text)
    return matches[-1].strip() or None if matches else None


def normalize_minerva_answer(answer: str) -> str:
    """Minerva's normalisation of a final answer (verl's ``math_dapo.normalize_final_answer``):
    the part after the last ``=``, spaces, units and text wrappers removed, ``\\boxed{}`` and
    ``$`` stripped, shorthand ``\\fracab`` / ``\\sqrta`` braced, thousands separators of an
    integer dropped."""
    answer = answer.split("=")[-1]
    for before, after in _MINERVA_SUBSTITUTIONS:
        answer = answer.replace(before, after)
    for expression in _MINERVA_REMOVED:
        answer = answer.replace(expression, "")
    answer = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", answer)
    for command in ("text", "textbf", "overline"):
        answer = re.sub(rf"(\\{command}\{{)(.*?)(\}})", "\\2", answer)
    answer = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", answer)
    answer = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", answer)
    answer = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def minerva_answers_equal(predicted: str, reference: str) -> bool:
    """Both answers normalised as Minerva's (:func:`normalize_minerva_answer`), then equal as
    strings (verl's ``math_dapo`` criterion) or by :func:`answers_equal` (numbers exactly,
    anything else symbolically): never stricter than verl."""
    predicted, reference = normalize_minerva_answer(predicted), normalize_minerva_answer(reference)
    return predicted == reference or (bool(predicted) and bool(reference) and answers_equal(predicted, reference))
