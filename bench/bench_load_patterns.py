"""How long loading the shipped pattern libraries takes: cold (grammar built, first parse)
and warm (the parser cached, as in a long-running process).

    python bench/bench_load_patterns.py
"""

import argparse
import time

from dpl.lang import load_patterns, shipped_libraries
from dpl.lang.parser import _lark


def timed(fn, repeat=1):
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main():
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    libs = shipped_libraries()
    cold = timed(lambda: load_patterns(libs))
    warm = timed(lambda: load_patterns(libs), repeat=20)
    _lark.cache_clear()
    grammar = timed(_lark)
    print(f"{'what':<40} {'ms':>8}")
    print(f"{'load the .dpl parser (tables cached)':<40} {grammar * 1e3:8.1f}")
    print(f"{'load ' + ', '.join(libs) + ' (cold)':<40} {cold * 1e3:8.1f}")
    print(f"{'load ' + ', '.join(libs) + ' (warm)':<40} {warm * 1e3:8.1f}")


if __name__ == "__main__":
    main()
