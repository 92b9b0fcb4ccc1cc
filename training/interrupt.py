"""Ctrl-C and SIGTERM as a request to stop training at the next step boundary.

A signal that lands inside a gradient step would leave weights, optimiser and step counter out of
step with one another; deferring it lets the loop write a consistent checkpoint (CDT's `last.pt`,
which `--resume` continues; a baseline's `progress.pt`, which the same command continues) exactly.
A second signal acts at once (the previous handler is restored on the first).

Work that is not training (evaluation workers, an export's staging folder) stops at once instead:
`sigterm_as_interrupt` makes SIGTERM raise KeyboardInterrupt as Ctrl-C does, so that `finally`
blocks run and `cdt` answers both with one line and exit code 130.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import NoReturn

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopRequest:
    """Context manager; `requested` turns True on the first SIGINT or SIGTERM."""

    def __init__(self, enabled: bool = True) -> None:
        # signal handlers can only be set from the main thread
        self.enabled = enabled and threading.current_thread() is threading.main_thread()
        self.requested = False
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopRequest:
        if self.enabled:
            for number in STOP_SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def _handle(self, number: int, frame: FrameType | None) -> None:
        self.requested = True
        signal.signal(number, self._previous.get(number, signal.SIG_DFL))  # type: ignore[arg-type]


class TrainingInterrupted(KeyboardInterrupt):
    """Raised once a stopped run's checkpoint holds the step it stopped at; `hint` says how to
    continue (default: `--resume` with that checkpoint)."""

    def __init__(self, checkpoint: Path, step: int, hint: str | None = None) -> None:
        super().__init__(
            f"stopped at step {step}; {hint or f'continue with --resume {checkpoint}'}"
        )
        self.checkpoint = checkpoint
        self.step = step


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """For the block, SIGTERM raises KeyboardInterrupt, as Ctrl-C does: the default would end the
    process where it stands, its `finally` blocks unrun (worker processes orphaned, a staging
    folder left). A no-op outside the main thread, where no handler can be set."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _interrupt(number: int, frame: FrameType | None) -> NoReturn:
    raise KeyboardInterrupt(signal.Signals(number).name)


def ignore_interrupts() -> None:
    """A worker process' initializer: Ctrl-C reaches the whole process group, and the parent,
    not each worker (with a traceback of its own), ends the work."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
