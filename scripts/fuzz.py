"""The hostile-input campaign at full scale: the fuzzers of tests/test_hostile_fuzz.py (the CI
suite runs them with a few hundred examples each) with the example counts of the issue 33
campaign: 6,000 parser mutations (.ir texts, .dpl files, numbers in types and attributes), and
rewrite rules, .npz sidecars, check hooks and ONNX nodes.

    python scripts/fuzz.py                       # every fuzzer at its campaign count
    python scripts/fuzz.py --count 20000         # 20,000 examples per fuzzer
    python scripts/fuzz.py --only sidecars onnx_nodes --count 5000

Every example must end in a result or a located DplError; the first that does not is shrunk by
hypothesis and printed, and the script exits 1.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent / "tests"


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(TESTS))  # the fuzzers and their helpers live with the tests
    from test_hostile_fuzz import FUZZERS, run_campaign

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, help="examples per fuzzer (default: each one's campaign count)")
    parser.add_argument("--only", nargs="+", choices=sorted(FUZZERS), metavar="NAME",
                        help=f"run only these fuzzers ({', '.join(FUZZERS)})")
    args = parser.parse_args(argv)
    names = args.only or list(FUZZERS)
    counts = {name: args.count if args.count is not None else FUZZERS[name][1] for name in names}
    start = time.perf_counter()
    try:
        run_campaign(counts, report=lambda line: print(f"{line} ({time.perf_counter() - start:.0f} s)", flush=True))
    except Exception as err:  # noqa: BLE001 (a failed example: hypothesis has printed it)
        print(f"campaign failed: {type(err).__name__}: {str(err)[:2000]}", file=sys.stderr)
        return 1
    print(f"{sum(counts.values())} examples, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
