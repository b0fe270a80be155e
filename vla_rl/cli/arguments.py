"""Argument helpers the ``vla-rl`` commands share: a template and its overrides, the shipped
templates' list for ``--help``, positive numbers."""

from __future__ import annotations

import argparse
import math

from vla_rl.errors import CommandLineError


def add_template_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``TEMPLATE`` and ``KEY=VALUE`` overrides positionals shared by the commands that
    run a template."""
    parser.add_argument("template", metavar="TEMPLATE", help="template file, or a name in dag_templates/")
    parser.add_argument(
        "overrides",
        nargs="*",
        default=[],  # a default: not listed as required when TEMPLATE is missing
        metavar="KEY=VALUE",
        help="dotted overrides: trainer.total_steps=5 (config), nodes.reward.dp_size=1 (a node's field), "
        "~algorithm.filter_groups (delete a setting: its default applies)",
    )


def split_overrides(items: list[str]) -> tuple[list[str], list[str]]:
    """The positionals of a command that takes names (a template, run directories) and overrides,
    split into ``(names, overrides)``: an override sets (``KEY=VALUE``) or deletes (``~KEY``).

    Raises:
        TemplateError: a deletion given after an override it would discard
            (:func:`vla_rl.dag.loader.check_deletion_order`).
    """
    from vla_rl.dag.loader import check_deletion_order

    overrides = [item for item in items if "=" in item or item.startswith("~")]
    check_deletion_order(overrides)
    return [item for item in items if item not in overrides], overrides


def one_template(names: list[str], message: str) -> str:
    """The one template of a command's ``names`` (:func:`split_overrides`).

    Raises:
        CommandLineError: none or several: an override without its value among them
            (:func:`check_no_valueless_override`), else ``message`` with the names.
    """
    if len(names) == 1:
        return names[0]
    check_no_valueless_override(names)
    raise CommandLineError(f"{message} (got {names or 'none'})")


def check_no_valueless_override(names: list[str]) -> None:
    """Refuse a name among a command's ``names`` (templates, run directories) shaped as a setting
    (``trainer.total_steps``: dotted words, no YAML suffix, no file of that name): an override
    whose ``=VALUE`` was left out, which the command would report as a second template or a
    directory that is none.

    Raises:
        CommandLineError: naming it.
    """
    import re
    from pathlib import Path

    for name in names:
        if re.fullmatch(r"[A-Za-z_]\w*(\.\w+)+", name) and not name.endswith((".yaml", ".yml")) and not Path(
                name).exists():
            raise CommandLineError(f"{name}: an override sets KEY=VALUE (or deletes ~KEY); give it a value, e.g. "
                                   f"{name}=...")


def shipped_templates() -> str:
    """The runnable templates of ``dag_templates/`` (not the phases and bases they include), one
    per line with its ``description`` (read as YAML text: no validation, nothing imported)."""
    import yaml

    from vla_rl.dag.loader import TEMPLATE_DIR

    lines = []
    for path in sorted(TEMPLATE_DIR.glob("*.yaml")):
        try:
            description = (yaml.safe_load(path.read_text()) or {}).get("description", "")
        except (OSError, yaml.YAMLError):
            description = "(unreadable)"
        lines.append(f"  {path.stem:<28} {description}")
    return "shipped templates (dag_templates/):\n" + "\n".join(lines)


def positive_int(text: str) -> int:
    """argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def seed_value(text: str) -> int:
    """argparse type: a seed, an integer in [0, :data:`~vla_rl.config.sections.MAX_SEED`]."""
    from vla_rl.config.sections import MAX_SEED

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer seed, got {text!r}") from None
    if not 0 <= value <= MAX_SEED:
        raise argparse.ArgumentTypeError(f"a seed is in [0, {MAX_SEED}], got {value}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value
