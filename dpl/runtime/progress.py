"""The one progress line dpl draws (``dpl profile``'s groups, a build's C compiles): on a
terminal only, rewritten in place with ``\\r``, ended with a newline when done.

A line whose total is not known yet (a build's compiles, submitted while the plan is walked)
shows only the count done, ``3 done``; once the total is known (:meth:`Progress.settle`) it
shows a bar and ``3/18``. So a fraction never goes from complete back to incomplete.

Log lines written while a bar is drawn go above it (:func:`above_progress`): the bar's line is
cleared, the log line written, the bar drawn again below it.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, TextIO

# one writer at a time on a terminal: the bars, and the log lines written above them
_screen = threading.RLock()
_shown: dict[int, "Progress"] = {}  # id(stream) -> the bar drawn on it now (its line not ended)


def terminal_stderr() -> TextIO | None:
    """stderr when it is a terminal, else None (no progress in logs, pipes and CI)."""
    try:
        return sys.stderr if sys.stderr is not None and sys.stderr.isatty() else None
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return None


class Progress:
    def __init__(self, total: int | None, stream: TextIO | None, width: int = 30, title: str = ""):
        """``total`` None: not known yet; work is added with :meth:`grow` and the total fixed
        with :meth:`settle`. The line ends when ``done`` reaches a known total, or at
        :meth:`finish`."""
        self.stream, self.width, self.title = stream, width, title
        self.known = total is not None
        self.total, self.done = total or 0, 0
        self._line = ""  # the text drawn now, "" when no line is drawn

    def grow(self, n: int = 1) -> None:
        """More work became known (builds are submitted while the plan is walked)."""
        with _screen:
            self.total += n

    def settle(self) -> None:
        """No more work will come: from now on the line shows the total."""
        with _screen:
            if not self.known:
                self.known = True
                self._draw("")

    def step(self, label: str) -> None:
        with _screen:
            self.done += 1
            self._draw(label)

    def _draw(self, label: str) -> None:
        if self.stream is None or (self.done == 0 and not self._line):
            return
        if self.known:
            filled = self.width * self.done // max(1, self.total)
            bar = "#" * filled + "." * (self.width - filled)
            text = f"{self.title}[{bar}] {self.done}/{self.total} {label[:40]:<40}"
        else:
            text = f"{self.title}{self.done} done {label[:40]:<40}"
        self.stream.write("\r" + text.ljust(len(self._line)))
        self._line = text
        _shown[id(self.stream)] = self
        if self.known and self.done >= self.total:
            self._end()
        self.stream.flush()

    def _end(self) -> None:
        self.stream.write("\n")
        self._line = ""
        if _shown.get(id(self.stream)) is self:
            del _shown[id(self.stream)]

    def finish(self) -> None:
        """End the line, if one is drawn."""
        with _screen:
            if self.stream is not None and self._line:
                self._end()
                self.stream.flush()


@contextlib.contextmanager
def above_progress(stream: TextIO) -> Iterator[None]:
    """Write on ``stream`` inside this context (a log line, ended with a newline) above the
    progress line drawn there, if any: the line is cleared first and drawn again after."""
    with _screen:
        bar = _shown.get(id(stream))
        if bar is None or not bar._line:
            yield
            return
        stream.write("\r" + " " * len(bar._line) + "\r")
        try:
            yield
        finally:
            stream.write("\r" + bar._line)
            stream.flush()
