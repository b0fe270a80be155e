"""The procedural arithmetic problems: levels of one operation on small integers, each with its
question and its GSM8K-style solution (a worked line, then ``#### <answer>``).

Two packages draw from them, which is why they live on the ground floor: the text workflow's
prompt datasets (:mod:`vla_rl.data.arithmetic` writes them in the verl/siiRL prompt format) and
the tiny causal LM's tokenizer corpus (:mod:`policies.causal_lm.tiny`). Standard library only.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass

_OPERATORS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


@dataclass(frozen=True)
class Level:
    """One difficulty level: ``a op b`` with ``a`` in ``a_range`` and ``b`` in ``b_range``.

    Attributes:
        name: the level's name, stored in ``extra_info.level``.
        op: one of ``+``, ``-``, ``*``.
        a_range, b_range: inclusive ranges of the operands; for ``-``, ``b`` is capped at ``a``
            so that answers stay non-negative.
        weight: relative sampling frequency.
    """

    name: str
    op: str
    a_range: tuple[int, int]
    b_range: tuple[int, int]
    weight: float

    def holds(self, a: int, op: str, b: int) -> bool:
        """Whether ``a op b`` is one of this level's problems (levels overlap: ``14 + 7`` is in
        ``add_small`` and ``add_2x1digit``)."""
        return (op == self.op and self.a_range[0] <= a <= self.a_range[1] and self.b_range[0] <= b <= self.b_range[1]
                and (op != "-" or b <= a))

    def pool_size(self) -> int:
        """Number of distinct problems of this level."""
        (a_low, a_high), (b_low, b_high) = self.a_range, self.b_range
        if self.op != "-":
            return (a_high - a_low + 1) * (b_high - b_low + 1)
        return sum(max(0, min(b_high, a) - b_low + 1) for a in range(a_low, a_high + 1))


#: The default levels, easiest first. On the tiny model, supervised fine-tuning learns the sums
#: first and subtraction much later (see docs/llm.md), which leaves RL something to improve.
LEVELS: tuple[Level, ...] = (
    Level("add_small", "+", (0, 20), (0, 9), weight=1.0),
    Level("add_2x1digit", "+", (10, 99), (0, 9), weight=1.0),
    Level("add_2digit", "+", (10, 99), (10, 99), weight=1.0),
    Level("sub_2digit", "-", (10, 99), (0, 99), weight=1.0),
)


@dataclass(frozen=True)
class ArithmeticProblem:
    """``a op b`` at a level; ``question``, ``solution`` and ``answer`` are its texts."""

    a: int
    op: str
    b: int
    level: str

    @property
    def answer(self) -> int:
        return _OPERATORS[self.op](self.a, self.b)

    @property
    def question(self) -> str:
        return f"What is {self.a} {self.op} {self.b}?"

    @property
    def solution(self) -> str:
        """The GSM8K-style target: the worked line, then ``#### <answer>``."""
        return f"{self.a} {self.op} {self.b} = {self.answer}\n#### {self.answer}"


def sample_problems(
    num_problems: int, seed: int, levels: Sequence[Level] = LEVELS, exclude: Collection[ArithmeticProblem] = frozenset()
) -> list[ArithmeticProblem]:
    """Distinct problems, each level drawn with probability proportional to its weight.

    Args:
        num_problems: how many problems.
        seed: seed of the draw.
        levels: the levels to draw from.
        exclude: problems never to return (e.g. the held-out split when drawing training ones).

    Returns:
        ``num_problems`` distinct problems, none in ``exclude``, in draw order.

    Raises:
        ValueError: the levels hold fewer than ``num_problems`` problems outside ``exclude``.
    """
    drawn = Counter(problem.level for problem in exclude)
    pool_sizes = {level.name: level.pool_size() for level in levels}
    open_levels = [level for level in levels if drawn[level.name] < pool_sizes[level.name]]
    available = sum(pool_sizes[level.name] - drawn[level.name] for level in open_levels)
    if num_problems > available:
        raise ValueError(
            f"asked for {num_problems} distinct arithmetic problems but the levels hold only {available} "
            "(after exclusions); widen the operand ranges or ask for fewer"
        )
    rng = random.Random(seed)
    seen = set(exclude)
    problems: list[ArithmeticProblem] = []
    while len(problems) < num_problems:
        level = rng.choices(open_levels, weights=[level.weight for level in open_levels])[0]
        a = rng.randint(*level.a_range)
        b_high = min(level.b_range[1], a) if level.op == "-" else level.b_range[1]
        if b_high < level.b_range[0]:
            continue  # no valid b for this a (only possible for "-")
        problem = ArithmeticProblem(a, level.op, rng.randint(level.b_range[0], b_high), level.name)
        if problem in seen:
            continue
        seen.add(problem)
        problems.append(problem)
        drawn[level.name] += 1
        if drawn[level.name] == pool_sizes[level.name]:
            open_levels.remove(level)
    return problems
