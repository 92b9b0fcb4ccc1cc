"""service/ modules stay readable: STYLE.md aims for 400 lines, and 450 is this package's cap."""

from __future__ import annotations

from pathlib import Path

import service

MAX_LINES = 450


def test_no_service_module_passes_the_hard_cap() -> None:
    root = Path(service.__file__).parent
    long = {
        str(path.relative_to(root)): count
        for path in sorted(root.rglob("*.py"))
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
