"""The kernel cache: compiled kernels by backend and exact key (structure + dtypes + shapes).

In memory, and shared by every group of the same structure — 32 identical decoder layers
compile once. The C backend adds a disk cache (``dpl.runtime.disk_cache``) under keys of its
own (the source, flags, compiler and CPU).
"""

from __future__ import annotations

from typing import Callable


class KernelCache:
    def __init__(self):
        self._kernels: dict[tuple[str, str], Callable] = {}
        self.hits = 0
        self.misses = 0

    def get(self, backend: str, key: str):
        kernel = self._kernels.get((backend, key))
        if kernel is None:
            self.misses += 1
        else:
            self.hits += 1
        return kernel

    def put(self, backend: str, key: str, kernel: Callable) -> None:
        self._kernels[(backend, key)] = kernel

    def keys(self) -> set[tuple[str, str]]:
        return set(self._kernels)

    def keep_only(self, keys: set[tuple[str, str]]) -> None:
        """Forget every kernel not under ``keys`` (a plan whose builds failed is made again)."""
        for k in set(self._kernels) - keys:
            del self._kernels[k]

    def __len__(self) -> int:
        return len(self._kernels)

    def __contains__(self, item: tuple[str, str]) -> bool:
        return item in self._kernels
