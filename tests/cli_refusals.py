"""The command line's refusal of an input, as the pre-flight tests check it."""

from __future__ import annotations

from pathlib import Path

from vla_rl.cli import main


def files_under(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def assert_cli_refuses_and_writes_nothing(capsys, tmp_path: Path, args: list[str], field: str, offending) -> None:
    """``vla-rl train`` and ``vla-rl plan`` with ``args`` (template and overrides) each end with
    status 2 and one ``error:`` line naming ``field`` and ``offending``, no traceback, nothing
    on stdout, and nothing written under ``tmp_path``."""
    before = files_under(tmp_path)
    runs = tmp_path / "runs"
    for command in ("train", "plan"):
        assert main([command, *args, f"run.output_dir={runs}"]) == 2
        captured = capsys.readouterr()
        errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1 and field in errors[0] and str(offending) in errors[0], captured.err
        assert "Traceback" not in captured.err + captured.out and captured.out == ""
    assert files_under(tmp_path) == before and not runs.exists()
