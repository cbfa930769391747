"""fastmode's hand-written CPU kernels, compiled on first use.

`ops()` returns the compiled extension, or None (with the reason in
`unavailable_reason()`) where it cannot be built: no C++ compiler, or
FASTMODE_KERNELS=off. Callers fall back to plain PyTorch then, so a machine
without a compiler still runs, only slower.

The build uses torch.utils.cpp_extension (ninja + the system C++ compiler) and
is cached under the fastmode cache directory, keyed by the sources, the torch
version and the compiler flags: the first use on a machine takes about a
minute, later ones load the cached library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_NAME = "fastmode_kernels"
_lock = threading.Lock()
_state: dict[str, object] = {}


def cpu_flags() -> set[str]:
    """The x86 feature flags of this machine's CPU (empty where /proc/cpuinfo has none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
AMX = {"amx_tile", "amx_bf16"}


def compile_flags() -> list[str]:
    """-O3, OpenMP (at::parallel_for is inlined and needs it) and, on x86 CPUs
    that have them, AVX2/FMA/F16C and AVX-512. The library is built for this
    machine. FASTMODE_KERNELS_ISA=avx2 leaves AVX-512 and AMX out, =avx512
    leaves AMX out (A/B comparisons, and the other paths' tests on a machine
    with more)."""
    flags = ["-O3", "-fopenmp"]
    cpu = cpu_flags()
    if platform.machine() in ("x86_64", "AMD64") and {"avx2", "fma", "f16c"} <= cpu:
        flags += ["-mavx2", "-mfma", "-mf16c"]
        isa = os.environ.get("FASTMODE_KERNELS_ISA", "").lower()
        if AVX512 <= cpu and isa != "avx2":
            flags += ["-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"]
            if AMX <= cpu and isa != "avx512":
                flags += ["-mamx-tile", "-mamx-bf16"]
    return flags


def _build_dir(sources: list[Path], flags: list[str]) -> Path:
    from fastmode.env import cache_dir

    h = hashlib.sha1()
    for src in sources:
        h.update(src.read_bytes())
    h.update(f"{torch.__version__}|{' '.join(flags)}|{platform.python_version()}".encode())
    root = cache_dir() or Path(os.environ.get("TMPDIR", "/tmp")) / "fastmode-kernels"
    d = root / "kernels" / h.hexdigest()[:16]
    d.mkdir(parents=True, exist_ok=True)
    return d


def ops() -> ModuleType | None:
    """The compiled kernels, building them if needed; None where unavailable."""
    with _lock:
        if "ops" in _state:
            return _state["ops"]  # type: ignore[return-value]
        module, reason = None, None
        if os.environ.get("FASTMODE_KERNELS", "").lower() in ("off", "0", "none"):
            reason = "disabled by FASTMODE_KERNELS=off"
        else:
            try:
                sources = sorted(_CSRC.glob("*.cpp"))
                flags = compile_flags()
                build_dir = _build_dir(sources, flags)
                module = _import_built(build_dir) or _compile(sources, flags, build_dir)
            except Exception as e:  # no compiler, no ninja, a read-only cache: run without the kernels
                reason = f"could not build fastmode's CPU kernels ({type(e).__name__}: {str(e).strip()[-300:]})"
                log.warning("%s; falling back to dequantized fp32 weights", reason)
        _state["ops"], _state["reason"] = module, reason
        return module


def _import_built(build_dir: Path) -> ModuleType | None:
    """The library a previous run built in `build_dir` (keyed by sources and flags), imported directly:
    cpp_extension.load would re-check the build with ninja, which costs a few seconds at every start."""
    import importlib.util

    lib = build_dir / f"{_NAME}.so"
    if not lib.exists():
        return None
    spec = importlib.util.spec_from_file_location(_NAME, lib)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(sources: list[Path], flags: list[str], build_dir: Path) -> ModuleType:
    import sys

    from torch.utils.cpp_extension import load

    # ninja from the `ninja` PyPI package lives next to this interpreter, which may not be on PATH.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    log.info("building fastmode's CPU kernels in %s (about a minute, once per machine)", build_dir)
    return load(
        name=_NAME,
        sources=[str(s) for s in sources],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        verbose=False,
    )


def unavailable_reason() -> str | None:
    """Why `ops()` returned None (None when the kernels are available)."""
    ops()
    return _state.get("reason")  # type: ignore[return-value]
