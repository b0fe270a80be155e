"""Final-answer extraction and equivalence on hand-written cases."""

from __future__ import annotations

from fractions import Fraction

import pytest

from vla_rl.rewards.math_answers import (
    answers_equal,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    parse_number,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7"),
        ("#### 1,234", "1234"),
        ("#### -5", "-5"),
        ("#### 2.50", "2.50"),
        ("####42", "42"),
        ("#### $18", "18"),
        ("first #### 3 then\n#### 4", "4"),  # the last marker wins
        # verl's strict pattern first: every answer it reads is read (a helper audit against
        # verl/utils/reward_score/gsm8k.py); the looser forms only where it finds none
        ("#### .5", ".5"),
        ("#### ,12", "12"),
        ("#### -,5", "-5"),
        ("#### 42.", "42"),
        ("#### 12 then #### $797", "12"),
        ("#### 12 then ####  37", "12"),
        ("#### 12 then ####\n1", "12"),
        ("####  37", "37"),
        ("the answer is 7", None),
        ("#### seven", None),
        ("", None),
    ],
)
def test_extract_hash_answer(text, expected):
    assert extract_hash_answer(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so it is 12, then 1,500 apples.", "1500"),
        ("-3 degrees", "-3"),
        ("costs .5 each", ".5"),
        ("no digits", None),
    ],
)
def test_extract_last_number(text, expected):
    assert extract_last_number(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{42}.", "42"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{ \\{1, 2\\} }", "\\{1, 2\\}"),
        ("\\boxed{1} then \\boxed{2}", "2"),
        ("\\fbox{x+1}", "x+1"),
        ("$\\boxed 5$", "5"),
        ("\\boxed{unclosed", None),
        ("no box", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("42", Fraction(42)),
        ("-0.50", Fraction(-1, 2)),
        ("1,234.5", Fraction(2469, 2)),
        ("+7", Fraction(7)),
        ("$18", Fraction(18)),
        ("\\$18", Fraction(18)),
        ("50%", Fraction(50)),
        ("3/4", Fraction(3, 4)),
        ("\\frac{3}{4}", Fraction(3, 4)),
        ("\\dfrac{-6}{4}", Fraction(-3, 2)),
        ("$12$", Fraction(12)),
        ("12.", Fraction(12)),
        ("1/0", None),
        ("1,23", None),
        ("x+1", None),
        ("12 apples", None),
        ("", None),
    ],
)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize(
    ("predicted", "reference", "equal"),
    [
        ("1000", "1,000", True),
        ("0.75", "3/4", True),
        ("5.0", "5", True),
        ("-2", "2", False),
        ("0.3333", "1/3", False),  # exact comparison of plain numbers: no rounding
        ("\\frac{1}{2}", "0.5", True),
        ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt 3}{2}", True),
        ("x^2 + 2x + 1", "(x+1)^2", True),
        ("\\pi", "3.14", False),
        ("banana", "42", False),
    ],
)
def test_answers_equal(predicted, reference, equal):
    assert answers_equal(predicted, reference) is equal
