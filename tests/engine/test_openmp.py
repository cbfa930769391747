"""release_thread_pool frees the calling thread's OpenMP workers, and parallel work still runs afterwards."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from fastmode.engine.openmp import _loaded_libgomp, release_thread_pool


def num_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(_loaded_libgomp() is None, reason="PyTorch's OpenMP runtime here is not libgomp")
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs two CPUs for an OpenMP worker thread")
def test_release_frees_the_calling_threads_workers():
    result: dict[str, object] = {}

    def work():
        torch.set_num_threads(2)
        a = torch.randn(512, 512)
        want = a @ a  # a parallel region: this thread now has a pool with a worker
        result["with_pool"] = num_threads()
        result["released"] = release_thread_pool()
        deadline = time.monotonic() + 5
        while num_threads() >= result["with_pool"] and time.monotonic() < deadline:
            time.sleep(0.01)
        result["after"] = num_threads()
        result["same"] = torch.equal(a @ a, want)  # the pool is rebuilt on demand

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert result["released"] is True
    assert result["after"] < result["with_pool"]
    assert result["same"] is True
