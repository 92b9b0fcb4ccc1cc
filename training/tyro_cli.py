"""tyro's parsing with the project's rule for a mistake: one line on stderr, exit code 2.

tyro draws a mistake in a multi-line box (title, the problem, the option's help, a pointer to
`--help`). Each `cdt` command that tyro parses calls `parse` instead, which keeps the box's
problem text in the one-line form argparse's commands use (`runtime.arguments.exit_on_mistake`).
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from collections.abc import Sequence
from typing import Any, TypeVar

import tyro

from runtime.arguments import exit_on_mistake
from runtime.user_errors import one_line

ConfigT = TypeVar("ConfigT")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EDGES = "│┃"
_RULES = set("─━-")
_ITEM_INDENT = 4  # an option's name in a box's list; its help is indented further


def _is_rule(line: str) -> bool:
    return bool(line.strip()) and set(line.strip()) <= _RULES


def _box_body(box: str) -> list[str]:
    """The lines inside a tyro error box, indents kept. tyro draws it with box characters when
    stdout is UTF-8, else as a title over a rule with the body indented by two spaces."""
    lines = [_ANSI.sub("", line).rstrip() for line in box.splitlines()]
    if any(line.lstrip().startswith("╭") for line in lines):
        framed = [line.strip() for line in lines]
        return [
            line[1:-1].removeprefix(" ")
            for line in framed
            if len(line) >= 2 and line[0] in _EDGES and line[-1] in _EDGES
        ]
    border = next((i for i, line in enumerate(lines) if _is_rule(line)), None)
    return [] if border is None else [line.removeprefix("  ") for line in lines[border + 1 :]]


def _box_sections(box: str) -> list[list[str]]:
    """The body of a tyro error box, as the sections its rules divide."""
    sections: list[list[str]] = [[]]
    for line in _box_body(box):
        if _is_rule(line):
            sections.append([])
        elif line.strip():
            sections[-1].append(line)
    return [section for section in sections if section]


def _without_help(section: list[str]) -> str:
    """A section's text, its listed options by name only (their help dropped)."""
    items = [line.strip() for line in section[1:] if _indent(line) == _ITEM_INDENT]
    if items:
        return f"{section[0].strip()} {', '.join(items)}"
    return " ".join(line.strip() for line in section)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def box_problem(box: str) -> str:
    """The problem a tyro error box names, on one line: its first section (a listed option by
    name, without its help) and any "Perhaps you meant" suggestion; the whole text on one line
    when it is not a box."""
    sections = _box_sections(box)
    if not sections:
        return one_line(box)
    problem = _without_help(sections[0])
    for section in sections[1:]:
        if section[0].strip().lower().startswith("perhaps you meant"):
            problem += f" (perhaps you meant {_without_help(section).split(':', 1)[1].strip()})"
    return one_line(problem)


def parse(
    config_type: type[ConfigT], args: Sequence[str] | None, prog: str, **options: Any
) -> ConfigT:
    """`tyro.cli(config_type, args=args, prog=prog, **options)`; a mistake is one line naming it
    on stderr and `SystemExit(2)`, `--help` is tyro's own."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            config: ConfigT = tyro.cli(config_type, args=args, prog=prog, **options)
    except SystemExit as stop:
        if stop.code in (0, None):  # --help, printed on stdout
            raise
        exit_on_mistake(prog, box_problem(captured.getvalue()))
    sys.stderr.write(captured.getvalue())  # warnings while parsing
    return config
