"""Two ways to run the same call, chosen by timing the calls: whichever recent calls found
faster runs, and the other is tried again now and then.

Used for how many threads a plan's call runs on (its budget, or one) and for which kernel a
CPU attention runs (flash or segments, ``backends/cpu/backend.py``).

More threads are not always faster. On a machine where another process holds a core, every
OpenMP barrier and every BLAS hand-off waits for a thread the scheduler is not running: on the
2-core bench host with one core busy, the 2-layer Llama at 1x128 took 10.9 ms on one thread and
322 ms on two (torch eager: 8.8 and 318). And a small model's kernels can be too short to
pay for waking a second thread. So a plan whose budget allows several threads times its calls
and runs each on the thread count whose recent calls were faster, trying the other again now
and then, as the load on the machine changes.

Which attention kernel is faster depends on the mask's values, which no build sees: the flash
kernel skips the tiles a causal mask hides and the segments' BLAS products win where nothing is
hidden (BERT at 1x512, padding mask: 25.0 ms with flash against 23.1 with segments; the causal
Llama at 1x512: 24.0 against 24.7).

The rule (:class:`TimedChoice`): each option's first :data:`WARM_UP` calls are warm-ups and
not counted (a prepared call is made at an option's first call and its runs joined at the
second, and both touch memory for the first time: bench_zoo's Llama at 1x128 took 5.6 and
7.5 ms on two threads, 3.4 and 3.1 on one, in its first calls, 1.4 and 2.1 after; with only
the plan's first call left out the two-thread median lost and the plan ran one thread for the
whole benchmark, in about one run of two); then the two options take turns until each has :data:`SAMPLES` calls (two are enough for an option
:data:`HOPELESS` times slower than the other's best: one was, until a two-thread call beside an ONNX
Runtime session's threads took 26 ms against 1.3 and kept a plan on one thread for a second of
calls); after that every call runs on the option
with the lower median of its last :data:`WINDOW` calls, and the other is tried again once the
calls since its last try have taken 1 / :data:`PROBE_SHARE` times what a try costs beyond a call
of the faster one (its median's excess, at least :data:`TIE` of the faster one's median), so
retrying costs at most about that share of the time: an option 60 times slower (300 ms against
5) is retried after about 15 s of calls of the faster one, two about as fast every few calls, so
a choice made under a passing load comes back soon (the zoo benchmark's two-thread runs kept one
thread when its first timings met torch's spinning threads and retries waited on the median).
A retry faster than the chosen option's median starts its option's window afresh, so one such
call is enough to switch: with the older calls kept, two more retries, each after its share of
the time, had to agree first.

Turns cost most where a plan is called rarely: a decoder's prefill runs once a ``generate``, so
its turns took six generates, and three of them ran the prompt on one thread (bench_generate at
2 threads: 22-26 ms against 15). So a many-thread call that beats the one-thread call by
:data:`CLEAR` ends the turns at once (``trusted``): load slows a call down, and a many-thread
call more (it waits for a thread the scheduler is not running), so such a win was no accident
of the machine's state; one thread is retried as ever, and comes back if it is faster.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque

from dpl.errors import count

SAMPLES = 3  # timed calls of each option before choosing
WARM_UP = 2  # calls of each option before its first timed one
WINDOW = 5  # recent calls an option's median is taken over
HOPELESS = 4.0  # calls this many times the other's best end that option's turns early
HOPELESS_CALLS = 2  # ... once it has this many: one call beside another pool's spinning threads is no verdict
CLEAR = 1.25  # the trusted option's median this many times faster than the other's ends the turns
PROBE_SHARE = 0.02  # the share of the time retrying the slower option may cost beyond the faster's
TIE = 0.1  # the least extra a retry is counted at, as a share of the faster option's call


class TimedChoice:
    """Chooses between two ``options`` by the timed calls :meth:`record` is given; ``names``
    says them in :meth:`describe`. Thread-safe."""

    def __init__(self, options: tuple, names: tuple[str, str], what: str, trusted=None):
        """``trusted``: the option whose first timed call, :data:`CLEAR` times faster than the
        other's, ends the turns (see the module text); None: none."""
        self.options = tuple(options)
        self.trusted = trusted
        self.names = dict(zip(self.options, names))
        self.what = what  # what is chosen, for describe: "threads", "attention"
        self._times = {o: deque(maxlen=WINDOW) for o in self.options}
        self._seen = {o: 0 for o in self.options}  # calls of each option, warm-ups included
        self._since_probe = 0.0  # seconds of calls on the faster option since the other's last try
        self._lock = threading.Lock()

    def _median(self, option) -> float:
        return statistics.median(self._times[option])

    def _settled(self, option) -> bool:
        times, other = self._times[option], self._times[self._other(option)]
        hopeless = len(times) >= HOPELESS_CALLS and other and min(times) > HOPELESS * min(other)
        return len(times) >= SAMPLES or bool(hopeless) or self._clear_win()

    def _clear_win(self) -> bool:
        if self.trusted is None:
            return False
        mine, other = self._times[self.trusted], self._times[self._other(self.trusted)]
        # medians, as the choice itself: by the fastest calls a disturbed first call (26 ms, then
        # 1.3) won clearly, ended the turns, and the median then chose the other option
        return bool(mine and other and CLEAR * statistics.median(mine) <= statistics.median(other))

    def _other(self, option):
        return self.options[1] if option == self.options[0] else self.options[0]

    def pick(self):
        """The option the next call runs on."""
        with self._lock:
            learning = [o for o in self.options if not self._settled(o)]
            if learning:  # turns: the option with fewer calls, the first on a tie
                return min(learning, key=lambda o: self._seen[o])
            best = min(self.options, key=self._median)
            other = self._other(best)
            # what a retry costs beyond a call on the best: its extra time, at least a tenth of
            # a call (two options about as fast are retried every few calls)
            extra = max(self._median(other) - self._median(best), TIE * self._median(best))
            return other if self._since_probe * PROBE_SHARE >= extra else best

    def record(self, option, seconds: float) -> None:
        """A call on ``option`` took ``seconds``."""
        with self._lock:
            self._seen[option] += 1
            if self._seen[option] <= WARM_UP:  # first touches, a prepared call made: not a sample
                return
            settled = all(self._settled(o) for o in self.options)
            best = min(self.options, key=self._median) if settled else None
            if best is not None and option != best and seconds < self._median(best):
                self._times[option].clear()  # a retry that beats the best: its older calls met another state
            self._times[option].append(seconds)
            if best is not None:
                self._since_probe = self._since_probe + seconds if option == best else 0.0

    def settled(self) -> bool:
        """Whether both options are timed, so :meth:`current` is the faster one's."""
        with self._lock:
            return all(self._settled(o) for o in self.options)

    def current(self):
        """The option calls run on now (the first until both are timed)."""
        with self._lock:
            if not all(self._settled(o) for o in self.options):
                return self.options[0]
            return min(self.options, key=self._median)

    def describe(self) -> str:
        """What it has seen, for ``exe.summary()``."""
        with self._lock:
            a, b = (self.names[o] for o in self.options)
            seen = [f"{self.names[o]} {1e3 * self._median(o):.3g} ms" for o in self.options if self._times[o]]
            if not seen:
                return f"{self.what}: {a} or {b}, whichever its calls find faster (no call timed yet)"
            if not all(self._settled(o) for o in self.options):
                return f"{self.what}: {a} or {b}, still timing (median of recent calls: {', '.join(seen)})"
            best = self.names[min(self.options, key=self._median)]
            return f"{self.what}: {best} now, the faster (median of recent calls: {', '.join(seen)})"


def thread_choice(many: int | None) -> TimedChoice:
    """A plan's thread budget ``many`` (an int > 1, or None: each pool's own threads) or one thread."""
    return TimedChoice((many, 1), ("each pool's own threads" if many is None else count(many, "thread"), "1 thread"), "threads",
                       trusted=many)


class RacedKernel:
    """A kernel (``run(inputs, outputs)``) that is either of two kernels computing the same
    thing, each call on the one a :class:`TimedChoice` picks. It keeps the kernel protocol of
    :mod:`dpl.runtime.threads` (``thread_pools``, ``threads``, ``with_threads``), and its
    ``note`` says what was chosen (``exe.summary()``)."""

    def __init__(self, first, second, names: tuple[str, str], what: str, why: str):
        self.kernels = (first, second)
        self.choice = TimedChoice((0, 1), names, what)
        self.why = why
        self.__qualname__ = f"{getattr(first, '__qualname__', 'kernel')} | {getattr(second, '__qualname__', 'kernel')}"
        self.source = "\n".join(getattr(k, "source", "") for k in self.kernels)
        self.thread_pools = frozenset().union(*(getattr(k, "thread_pools", ()) for k in self.kernels))
        self.threads = next((k.threads for k in self.kernels if hasattr(k, "threads")), None)
        lists = {id(getattr(k, "call_list", None)) for k in self.kernels}
        self.call_list = getattr(first, "call_list", None) if len(lists) == 1 else None  # dpl.runtime.prepared

    def preparable(self) -> bool:
        """Whether :meth:`prepare` may give C calls now (a prepared call made before asks again)."""
        return self.choice.settled() and callable(getattr(self.kernels[self.choice.current()], "prepare", None))

    def prepare(self, inputs, outputs):
        """The C calls of the kernel the race chose, once both are timed (a prepared call then
        runs it, and keeps it: the race goes on only in calls that are not prepared, and in plans
        prepared later); None before, or where the chosen kernel has none (``dpl.runtime.prepared``)."""
        if not self.choice.settled():
            return None
        chosen = self.kernels[self.choice.current()]
        prepare = getattr(chosen, "prepare", None)
        return prepare(inputs, outputs) if callable(prepare) else None

    def __call__(self, inputs, outputs) -> None:
        which = self.choice.pick()
        start = time.perf_counter()
        self.kernels[which](inputs, outputs)
        self.choice.record(which, time.perf_counter() - start)

    @property
    def note(self) -> str:
        return f"{self.choice.describe()} ({self.why})"

    def with_threads(self, n: int | None) -> "RacedKernel":
        """Both kernels on at most ``n`` threads (those that can be capped), timed afresh."""
        capped = [k.with_threads(n) if hasattr(k, "with_threads") else k for k in self.kernels]
        if all(c is k for c, k in zip(capped, self.kernels)):
            return self
        a, b = self.choice.names.values()
        return RacedKernel(*capped, (a, b), self.choice.what, self.why)
