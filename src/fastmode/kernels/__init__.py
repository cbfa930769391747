"""fastmode's hand-written CPU kernels, compiled on first use.

`ops()` returns the compiled extension, or None (with the reason in
`unavailable_reason()`) where it cannot be built: no C++ compiler, or
FASTMODE_KERNELS=off. Callers fall back to plain PyTorch then, so a machine
without a compiler still runs, only slower.

Which instruction set the kernels run is decided here, in one place, at run time: `select_isa()`
takes the best of `ISA_PATHS` that this machine's CPU has, up to the cap FASTMODE_KERNELS_ISA
(A/B runs, and testing a lower path on a machine that has more). Each path is its own build of
the same sources with that path's compiler flags, so every build is correct on every machine
that has its features, and `ops(isa)` loads any of them beside the others in one process (the
tests compare every path this machine has against an exact reference).

The build uses torch.utils.cpp_extension (ninja + the system C++ compiler) and
is cached under the fastmode cache directory, keyed by the sources, the torch
version and the compiler flags: the first use of a path on a machine takes about a
minute, later ones load the cached library.
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

_CSRC = Path(__file__).parent / "csrc"
_NAME = "fastmode_kernels"
_lock = threading.Lock()
_builds: dict[str, tuple[ModuleType | None, str | None]] = {}  # path -> (module, why not)


def cpu_flags() -> set[str]:
    """The x86 feature flags of this machine's CPU (empty where /proc/cpuinfo has none).
    Linux lists a feature only where the OS also saves its register state, so a listed
    AVX-512 or AMX feature can be used."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


AVX2 = {"avx2", "fma", "f16c"}
AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
AMX = {"amx_tile", "amx_bf16"}


@dataclass(frozen=True)
class IsaPath:
    """One build of the kernels: the CPU features it needs and the compiler flags it adds, on top
    of those of the path it extends (`base`)."""

    name: str
    base: str | None
    features: frozenset[str]
    flags: tuple[str, ...]
    what: str  # what the path changes, for logs and docs

    def required(self) -> set[str]:
        return set(self.features) | (ISA_PATHS[self.base].required() if self.base else set())

    def compile_flags(self) -> list[str]:
        return (ISA_PATHS[self.base].compile_flags() if self.base else []) + list(self.flags)


# Lowest first: a cap names one of these and allows it and every path before it.
ISA_PATHS: dict[str, IsaPath] = {
    p.name: p
    for p in (
        IsaPath("portable", None, frozenset(), (), "plain C++, the compiler's own vectorization"),
        IsaPath(
            "avx2",
            "portable",
            frozenset(AVX2),
            ("-mavx2", "-mfma", "-mf16c"),
            "8-lane fp32 FMAs; int8 dot products as vpmaddubsw + vpmaddwd",
        ),
        IsaPath(
            "avx2_vnni",
            "avx2",
            frozenset({"avx_vnni"}),
            ("-mavxvnni",),
            "int8 dot products in one vpdpbusd (VEX-encoded AVX-VNNI)",
        ),
        IsaPath(
            "avx512",
            "avx2",
            frozenset(AVX512),
            ("-mavx512f", "-mavx512bw", "-mavx512dq", "-mavx512vl"),
            "16-lane fp32 FMAs and dequantization",
        ),
        IsaPath(
            "avx512_vnni",
            "avx512",
            frozenset({"avx512_vnni"}),
            ("-mavx512vnni",),
            "int8 dot products in one vpdpbusd (AVX-512 VNNI)",
        ),
        IsaPath(
            "amx",
            "avx512_vnni",
            frozenset(AMX),
            ("-mamx-tile", "-mamx-bf16"),
            "fp32-activation matmuls of 9 or more rows on AMX bf16 tiles, exactly",
        ),
    )
}


def _is_x86() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def isa_unavailable_reason(name: str, cpu: set[str] | None = None) -> str | None:
    """Why this machine cannot run path `name` (None when it can)."""
    if name not in ISA_PATHS:
        raise ValueError(f"unknown kernel ISA path {name!r}; one of: {', '.join(ISA_PATHS)}")
    if name == "portable":
        return None
    if cpu is None:
        if not _is_x86():
            return f"not an x86 CPU ({platform.machine()})"
        cpu = cpu_flags()
    missing = sorted(ISA_PATHS[name].required() - cpu)
    return f"the CPU lacks {', '.join(missing)}" if missing else None


def isa_cap() -> str | None:
    """FASTMODE_KERNELS_ISA, checked (None when unset)."""
    cap = os.environ.get("FASTMODE_KERNELS_ISA", "").strip().lower()
    if not cap:
        return None
    if cap not in ISA_PATHS:
        raise ValueError(f"FASTMODE_KERNELS_ISA={cap!r} is not a kernel ISA path; one of: {', '.join(ISA_PATHS)}")
    return cap


def select_isa(cpu: set[str] | None = None, cap: str | None = None) -> str:
    """The path the kernels run: the last of ISA_PATHS up to `cap` (default FASTMODE_KERNELS_ISA)
    that the CPU (default this machine's flags) has."""
    cap = isa_cap() if cap is None else cap
    names = list(ISA_PATHS)
    allowed = names[: names.index(cap) + 1] if cap else names
    return [n for n in allowed if isa_unavailable_reason(n, cpu) is None][-1]


def compile_flags(isa: str | None = None) -> list[str]:
    """-O3, OpenMP (at::parallel_for is inlined and needs it), hidden symbols (builds of several
    paths load into one process side by side) and the path's instruction-set flags."""
    return ["-O3", "-fopenmp", "-fvisibility=hidden"] + ISA_PATHS[isa or select_isa()].compile_flags()


def _build_dir(sources: list[Path], flags: list[str]) -> Path:
    from fastmode.env import cache_dir

    h = hashlib.sha1()
    for src in sorted({*sources, *_CSRC.glob("*.h")}):  # headers too: a change to one is a new build
        h.update(src.read_bytes())
    h.update(f"{torch.__version__}|{' '.join(flags)}|{platform.python_version()}".encode())
    root = cache_dir() or Path(os.environ.get("TMPDIR", "/tmp")) / "fastmode-kernels"
    d = root / "kernels" / h.hexdigest()[:16]
    d.mkdir(parents=True, exist_ok=True)
    return d


def ops(isa: str | None = None) -> ModuleType | None:
    """The compiled kernels for path `isa` (default: `select_isa()`), building them if needed;
    None where unavailable (the reason in `unavailable_reason(isa)`)."""
    disabled = os.environ.get("FASTMODE_KERNELS", "").lower() in ("off", "0", "none")
    name = isa or ("portable" if disabled else select_isa())
    with _lock:
        key = "off" if disabled else name
        if key in _builds:
            return _builds[key][0]
        module, reason = None, None
        if disabled:
            reason = "disabled by FASTMODE_KERNELS=off"
        elif (why := isa_unavailable_reason(name)) is not None:
            reason = f"kernel ISA path {name} cannot run here: {why}"
        else:
            try:
                sources = sorted(_CSRC.glob("*.cpp"))
                flags = compile_flags(name)
                build_dir = _build_dir(sources, flags)
                module = _import_built(build_dir, name) or _compile(sources, flags, build_dir, name)
            except Exception as e:  # no compiler, no ninja, a read-only cache: run without the kernels
                reason = f"could not build fastmode's CPU kernels ({type(e).__name__}: {str(e).strip()[-300:]})"
                log.warning("%s; falling back to dequantized fp32 weights", reason)
        _builds[key] = (module, reason)
        return module


def _module_name(isa: str) -> str:
    return f"{_NAME}_{isa}"  # one extension module per path, so several load into one process


def _import_built(build_dir: Path, isa: str) -> ModuleType | None:
    """The library a previous run built in `build_dir` (keyed by sources and flags), imported directly:
    cpp_extension.load would re-check the build with ninja, which costs a few seconds at every start."""
    import importlib.util

    lib = build_dir / f"{_module_name(isa)}.so"
    if not lib.exists():
        return None
    spec = importlib.util.spec_from_file_location(_module_name(isa), lib)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compile(sources: list[Path], flags: list[str], build_dir: Path, isa: str) -> ModuleType:
    import sys

    from torch.utils.cpp_extension import load

    # ninja from the `ninja` PyPI package lives next to this interpreter, which may not be on PATH.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    log.info("building fastmode's CPU kernels (%s) in %s (about a minute, once per machine)", isa, build_dir)
    return load(
        name=_module_name(isa),
        sources=[str(s) for s in sources],
        extra_cflags=flags,
        extra_ldflags=["-fopenmp"],
        build_directory=str(build_dir),
        verbose=False,
    )


def unavailable_reason(isa: str | None = None) -> str | None:
    """Why `ops(isa)` returned None (None when the kernels are available)."""
    ops(isa)
    disabled = os.environ.get("FASTMODE_KERNELS", "").lower() in ("off", "0", "none")
    return _builds["off" if disabled else (isa or select_isa())][1]
