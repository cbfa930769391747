"""Keep one OpenMP worker pool per process where the engine steps on its own thread.

PyTorch's CPU wheels use GNU OpenMP (libgomp). libgomp gives every thread that
starts a parallel region its own pool of worker threads, and once the pools
together hold more threads than the machine has CPUs, every worker stops
spinning between regions after ~1000 iterations and sleeps on a futex instead:
each of the hundreds of parallel regions in a step then pays a wake-up. A
server loads its model on the main thread (that thread's pool is created
then) and steps the engine on another (a second pool), which is exactly that
case, and the engine thread then runs measurably slower than the same steps
on the main thread (`benchmarks/engine_thread.py` compares the two, with and
without the release below).

`release_thread_pool()` frees the calling thread's pool (OpenMP 5.0's
omp_pause_resource_all, soft pause: the pool is rebuilt if that thread runs a
parallel region again). Written here because no library exposes it; it is a
no-op where the OpenMP runtime is not libgomp or is too old to have the call.
"""

from __future__ import annotations

import ctypes
import logging
from pathlib import Path

log = logging.getLogger(__name__)

_OMP_PAUSE_SOFT = 1


def _loaded_libgomp() -> str | None:
    """The path of the libgomp this process has loaded (PyTorch's), or None."""
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if "/libgomp" in path and ".so" in path:
                return path
    except (OSError, IndexError):
        return None
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (if it has any). True where libgomp accepted
    the call, False where there is no libgomp or the call was refused."""
    path = _loaded_libgomp()
    if path is None:
        return False
    try:
        lib = ctypes.CDLL(path)  # already loaded: this returns the same library
        pause = lib.omp_pause_resource_all
    except (OSError, AttributeError):
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    ok = pause(_OMP_PAUSE_SOFT) == 0
    if not ok:
        log.debug("omp_pause_resource_all refused (called inside a parallel region?)")
    return ok
