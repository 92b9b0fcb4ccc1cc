"""Where an artifact came from: the commit of the code that made it."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(cwd: Path | None = None) -> str | None:
    """Short hash of the checked-out commit, or None outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=cwd or Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit or None
