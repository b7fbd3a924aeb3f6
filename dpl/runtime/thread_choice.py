"""How many threads a plan's call runs on: its budget, or one, whichever its recent calls
found faster.

More threads are not always faster. On a machine where another process holds a core, every
OpenMP barrier and every BLAS hand-off waits for a thread the scheduler is not running: on the
2-core bench host with one core busy, the 2-layer Llama at 1x128 took 5.5 ms on one thread and
318-322 ms on two, dpl and torch eager alike. And a small model's kernels can be too short to
pay for waking a second thread. So a plan whose budget allows several threads times its calls
and runs each on the thread count whose recent calls were faster, trying the other again now
and then, as the load on the machine changes.

The rule (:class:`ThreadChoice`): a plan's first call is a warm-up and not counted; then the
two counts take turns until each has :data:`SAMPLES` calls (one call is enough for a count
:data:`HOPELESS` times slower than the other's best); after that every call runs on the count
with the lower median of its last :data:`WINDOW` calls, and the other is tried again once the
calls since its last try have taken :data:`PROBE_SHARE`\\ :sup:`-1` times its median, so trying
costs at most about that share of the time (a count 60 times slower is retried after 30 s of
calls of the faster one at 0.02).
"""

from __future__ import annotations

import statistics
import threading
from collections import deque

SAMPLES = 3  # timed calls of each count before choosing
WINDOW = 5  # recent calls a count's median is taken over
HOPELESS = 4.0  # a first call this many times the other's best ends that count's turns early
PROBE_SHARE = 0.02  # the share of the time retrying the slower count may cost


class ThreadChoice:
    """Chooses between a plan's thread budget ``many`` (an int > 1, or None: each pool's own
    threads) and one thread, by the timed calls :meth:`record` is given. Thread-safe."""

    def __init__(self, many: int | None):
        self.options = (many, 1)
        self._times = {o: deque(maxlen=WINDOW) for o in self.options}
        self._warm = False
        self._since_probe = 0.0  # seconds of calls on the chosen count since the other's last try
        self._lock = threading.Lock()

    def _median(self, option) -> float:
        return statistics.median(self._times[option])

    def _settled(self, option) -> bool:
        times, other = self._times[option], self._times[self._other(option)]
        return len(times) >= SAMPLES or bool(times and other and min(times) > HOPELESS * min(other))

    def _other(self, option):
        return self.options[1] if option == self.options[0] else self.options[0]

    def pick(self):
        """The thread count the next call runs on."""
        with self._lock:
            if not self._warm:
                return self.options[0]
            learning = [o for o in self.options if not self._settled(o)]
            if learning:
                return min(learning, key=lambda o: len(self._times[o]))
            best = min(self.options, key=self._median)
            other = self._other(best)
            return other if self._since_probe * PROBE_SHARE >= self._median(other) else best

    def record(self, option, seconds: float) -> None:
        """A call on ``option`` threads took ``seconds``."""
        with self._lock:
            if not self._warm:
                self._warm = True  # the first call pays for first touches: not a sample
                return
            settled = all(self._settled(o) for o in self.options)
            best = min(self.options, key=self._median) if settled else None
            self._times[option].append(seconds)
            if best is not None:
                self._since_probe = self._since_probe + seconds if option == best else 0.0

    def describe(self) -> str:
        """What it has seen, for ``exe.summary()``."""
        with self._lock:
            name = lambda o: "each pool's own threads" if o is None else f"{o} thread(s)"  # noqa: E731
            seen = [f"{name(o)} {1e3 * self._median(o):.3g} ms" for o in self.options if self._times[o]]
            if not seen:
                return f"threads: {name(self.options[0])} or 1, whichever its calls find faster (no call timed yet)"
            if not all(self._settled(o) for o in self.options):
                return f"threads: {name(self.options[0])} or 1, still timing (median of recent calls: {', '.join(seen)})"
            best = min(self.options, key=self._median)
            return f"threads: {name(best)} now, the faster (median of recent calls: {', '.join(seen)})"
