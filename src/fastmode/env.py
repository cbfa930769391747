"""Every environment variable fastmode reads, in one place."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path | None:
    """Where converted checkpoints are cached. FASTMODE_CACHE_DIR=off disables the cache."""
    value = os.environ.get("FASTMODE_CACHE_DIR", "")
    if value.lower() in ("off", "0", "none"):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "fastmode"


def api_key() -> str | None:
    """The server's API key (FASTMODE_API_KEY); None = no authentication."""
    return os.environ.get("FASTMODE_API_KEY") or None
