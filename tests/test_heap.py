"""dpl.runtime.heap: glibc keeps freed memory mapped once a CPU build meets a product, unless the
user said otherwise; each case in a fresh process, as the setting is per process."""

import os
import subprocess
import sys

import pytest

from dpl.runtime import heap

SCRIPT = "from dpl.runtime import heap; first = heap.keep_mapped(); assert heap.keep_mapped() == first; print(first)"


def said(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in heap.USER_SETTINGS and k != "DPL_KEEP_MAPPED"}
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env={**clean, **env}, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(heap._mallopt() is None, reason="not glibc: keep_mapped leaves the C library alone there")
def test_glibc_keeps_freed_memory_mapped_by_default():
    assert said() == "freed memory: kept mapped (glibc mmap threshold 64 MiB, trim threshold 128 MiB)"


def test_the_users_malloc_settings_win():
    assert said(MALLOC_MMAP_THRESHOLD_="1048576") == "freed memory: the MALLOC_*_THRESHOLD_ environment settings, as given"
    assert said(MALLOC_TRIM_THRESHOLD_="0") == "freed memory: the MALLOC_*_THRESHOLD_ environment settings, as given"


def test_it_can_be_turned_off():
    assert said(DPL_KEEP_MAPPED="0") == "freed memory: left to the C library (DPL_KEEP_MAPPED=0)"
