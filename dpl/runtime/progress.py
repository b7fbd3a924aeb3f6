"""The one progress line dpl draws (``dpl profile``'s groups, a build's C compiles): on a
terminal only, rewritten in place with ``\\r``, ended with a newline when done."""

from __future__ import annotations

import sys
import threading
from typing import TextIO


def terminal_stderr() -> TextIO | None:
    """stderr when it is a terminal, else None (no progress in logs, pipes and CI)."""
    try:
        return sys.stderr if sys.stderr is not None and sys.stderr.isatty() else None
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return None


class Progress:
    def __init__(self, total: int, stream: TextIO | None, width: int = 30, title: str = "", end_when_done: bool = True):
        """``end_when_done``: end the line when ``done`` reaches ``total`` (else at :meth:`finish`,
        for work whose total grows while it runs)."""
        self.total, self.stream, self.width, self.done, self.title = total, stream, width, 0, title
        self.end_when_done, self._drawn = end_when_done, False
        self._lock = threading.Lock()

    def grow(self, n: int = 1) -> None:
        """More work became known (builds are submitted while the plan is walked)."""
        with self._lock:
            self.total += n
            self._draw("")

    def step(self, label: str) -> None:
        with self._lock:
            self.done += 1
            self._draw(label)

    def _draw(self, label: str) -> None:
        if self.stream is None:
            return
        filled = self.width * self.done // max(1, self.total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.title}[{bar}] {self.done}/{self.total} {label[:40]:<40}")
        self._drawn = True
        if self.end_when_done and self.done == self.total:
            self.stream.write("\n")
            self._drawn = False
        self.stream.flush()

    def finish(self) -> None:
        """End the line, if one is drawn."""
        with self._lock:
            if self.stream is not None and self._drawn:
                self.stream.write("\n")
                self.stream.flush()
                self._drawn = False
