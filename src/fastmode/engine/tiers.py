"""Service tiers. Lower rank is served first."""

from __future__ import annotations

from enum import Enum


class Tier(str, Enum):
    FAST = "fast"
    STANDARD = "standard"
    FLEX = "flex"

    @property
    def rank(self) -> int:
        return _RANK[self]

    @classmethod
    def parse(cls, value: str | Tier | None) -> Tier:
        if value is None:
            return cls.STANDARD
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"unknown service tier {value!r}; use fast, standard or flex") from None


_RANK = {Tier.FAST: 0, Tier.STANDARD: 1, Tier.FLEX: 2}

# OpenAI `service_tier` values with a fixed tier. "auto" is absent on purpose: what it gets depends on
# who serves it (fastmode's server admits it to the fast lane when there is room; the vLLM scheduler
# plugin serves it by its vLLM priority). "scale" is OpenAI's, and not offered here.
OPENAI_SERVICE_TIERS = {"priority": Tier.FAST, "fast": Tier.FAST, "default": Tier.STANDARD, "flex": Tier.FLEX}
