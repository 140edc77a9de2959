"""Memory settings of a long-running process whose every window allocates and frees the same
large arrays (the coordinator): its freed memory kept for its next allocations instead of
handed back to the kernel (glibc ``mallopt``), and the objects of its start-up left out of
the garbage collector's passes (``gc.freeze``).

A window at 256 VMs is a few dozen numpy passes over its ~640 000 probe records: arrays of
5-20 MB, each allocated and freed within the window. By default glibc serves such an
allocation with ``mmap`` (or from the heap's top, which it trims back to the kernel when it is
freed), so every array is faulted in again page by page and the kernel zeroes each page:
measured on the 256-VM feed of ``benchmarks/coordinator.py``, 124 000 minor page faults over
11 windows against 50 000 with this setting (the rest is the first touch of the process's
peak memory); a loop that allocates and frees such arrays took 60 % less CPU with it. With
``M_MMAP_THRESHOLD`` raised, allocations below it come from the heap; with
``M_TRIM_THRESHOLD`` raised, freed memory at the heap's top stays mapped for reuse. The
process's resident memory then stays at its peak (what the windows need at once) instead of
shrinking between windows.

Every window also makes and drops tens of thousands of Python objects (8000 directions'
OWD at 256 VMs), so the collector runs often, and each of its full passes walked every object
alive, most of them modules, classes and functions of the imports (perf: 5 % of the
coordinator's CPU in the collector on that feed). ``gc.freeze`` after start-up moves those
into a generation the collector no longer walks.

Source: glibc's ``mallopt(3)`` (``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``; setting either
also turns off glibc's dynamic adjustment of both).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc

__all__ = ["KEEP_BYTES", "keep_freed_memory", "settle"]

KEEP_BYTES = 1 << 30
"""Allocations below this size (bytes) come from the heap, and up to this much freed memory
at its top stays mapped."""
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_memory(keep_bytes: int = KEEP_BYTES) -> bool:
    """Set this process's ``M_MMAP_THRESHOLD`` and ``M_TRIM_THRESHOLD`` to ``keep_bytes``.

    Args:
        keep_bytes: bytes (> 0).

    Returns:
        True when glibc took both; False without glibc's ``mallopt`` (another libc: nothing
        changed) or when it refused a value.

    Raises:
        ValueError: ``keep_bytes`` not > 0.
    """
    if keep_bytes <= 0:
        raise ValueError(f"keep_bytes must be > 0, got {keep_bytes}")
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    value = min(keep_bytes, 2**31 - 1)
    took_mmap = mallopt(_M_MMAP_THRESHOLD, value)
    took_trim = mallopt(_M_TRIM_THRESHOLD, value)
    return bool(took_mmap and took_trim)


def settle() -> bool:
    """After a daemon's start-up: ``keep_freed_memory()``, then ``gc.freeze()`` (every object
    alive now is left out of the collector's passes). Returns what ``keep_freed_memory``
    returned."""
    kept = keep_freed_memory()
    gc.freeze()
    return kept
