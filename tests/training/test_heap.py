"""Keeping freed memory in the heap (training/heap.py)."""

from __future__ import annotations

import platform

import pytest
import torch

from training.heap import keep_freed_memory


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_keeps_freed_memory_and_tensors_stay_correct() -> None:
    assert keep_freed_memory() is True
    for _ in range(3):  # large blocks freed and taken again from the heap, not from mmap
        big = torch.ones(2_000_000)
        assert float(big.sum()) == 2_000_000.0
        del big
