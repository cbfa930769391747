"""Pools: which engines a Ray Serve deployment of fastmode runs, and which tier each serves.

A pool is a set of identical engine replicas with one engine config. Four names:

- `standard`: standard traffic (and fast or flex traffic when no pool of their own exists);
- `fast`: fast traffic only, with a small batch cap so its steps stay short;
- `flex`: flex traffic, when it should not share the standard replicas;
- `spark`: the default model's Spark student, served as its own model (`<name>-spark`).

A pools spec is either the short form `standard=2,fast=1,spark=1` (each pool with
its default settings) or a JSON file (what `fastmode plan --pools-out` writes):

    {"pools": {"fast": {"replicas": 2, "max_num_seqs": 8, "fast_lane_max_batch": 8},
               "standard": {"replicas": 3, "max_num_seqs": 64, "speculative_method": "off"}}}

Every key of a pool other than `replicas` is an `EngineConfig` flat name (the
`fastmode serve` flag without dashes) that overrides the base engine config for
that pool. No Ray and no torch here: the command line and the planner read it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastmode.engine.tiers import Tier

POOL_NAMES = ("standard", "fast", "flex", "spark")

# What each pool changes in the base engine config when the spec gives only a replica count.
# The fast pool's replicas hold few sequences (a short step is the fast tier's promise) and
# run the fast lane at that size; Spark is itself the small model, so it never drafts.
POOL_DEFAULTS: dict[str, dict[str, Any]] = {
    "standard": {},
    "fast": {"max_num_seqs": 8, "fast_lane_max_batch": 4},
    "flex": {},
    "spark": {"speculative_method": "off", "draft_model": None},
}


def deployment_name(pool: str) -> str:
    """The Ray Serve deployment of a pool: `fastmode-fast`, `fastmode-standard`, ..."""
    return f"fastmode-{pool}"


@dataclass(frozen=True)
class PoolSpec:
    name: str
    replicas: int = 1
    engine: Mapping[str, Any] = field(default_factory=dict)  # EngineConfig flat name -> value, over the base

    def __post_init__(self) -> None:
        if self.name not in POOL_NAMES:
            raise ValueError(f"unknown pool {self.name!r}; pools are {', '.join(POOL_NAMES)}")
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"pool {self.name}: replicas must be an integer >= 1, got {self.replicas!r}")
        from fastmode.engine.config import EngineConfig  # torch-free: the config's parts are policy

        known = set(EngineConfig.field_names())
        unknown = sorted(set(self.engine) - known)
        if unknown:
            raise ValueError(f"pool {self.name}: {', '.join(unknown)} is not an engine setting")

    def engine_kwargs(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The flat EngineConfig keywords of this pool's replicas: `base`, then the pool's settings."""
        return {**base, **self.engine}

    def to_dict(self) -> dict[str, Any]:
        return {"replicas": self.replicas, **self.engine}


@dataclass(frozen=True)
class PoolsSpec:
    pools: tuple[PoolSpec, ...]

    def __post_init__(self) -> None:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError(f"a pool is named twice in {', '.join(names)}")
        if "standard" not in names:
            raise ValueError("a pools spec needs a standard pool: standard traffic, and auto's fallback, run there")

    def __getitem__(self, name: str) -> PoolSpec:
        return next(p for p in self.pools if p.name == name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pools)

    def pool_for(self, tier: Tier) -> str:
        """The pool that serves `tier` for the main model: its own pool if there is one, else standard."""
        own = {Tier.FAST: "fast", Tier.FLEX: "flex"}.get(tier)
        return own if own in self.names else "standard"

    @property
    def tier_pools(self) -> dict[Tier, str]:
        return {t: self.pool_for(t) for t in Tier}

    def short_form(self) -> str:
        return ",".join(f"{p.name}={p.replicas}" for p in self.pools)

    def to_dict(self) -> dict[str, Any]:
        return {"pools": {p.name: p.to_dict() for p in self.pools}}


def parse_pools(spec: str | Mapping[str, Any] | PoolsSpec) -> PoolsSpec:
    """A pools spec from the short form, a JSON file's path, or its parsed content."""
    if isinstance(spec, PoolsSpec):
        return spec
    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    text = spec.strip()
    if not text:
        raise ValueError("the pools spec is empty; give e.g. standard=2,fast=1")
    if "=" not in text or Path(text).is_file():
        path = Path(text)
        try:
            content = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise ValueError(f"cannot read the pools spec {text}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"the pools spec {text} is not JSON: {e}") from None
        return _from_mapping(content)
    pools = []
    for item in text.split(","):
        name, _, count = item.strip().partition("=")
        try:
            replicas = int(count)
        except ValueError:
            raise ValueError(f"pools spec item {item.strip()!r}: write POOL=REPLICAS, e.g. fast=1") from None
        name = name.strip()
        pools.append(PoolSpec(name, replicas, dict(POOL_DEFAULTS.get(name, {}))))
    return PoolsSpec(tuple(pools))


def _from_mapping(content: Mapping[str, Any]) -> PoolsSpec:
    pools = content.get("pools") if isinstance(content, Mapping) else None
    if not isinstance(pools, Mapping):
        raise ValueError('a pools spec file holds {"pools": {"<pool>": {"replicas": N, ...}, ...}}')
    out = []
    for name, settings in pools.items():
        if not isinstance(settings, Mapping):
            raise ValueError(f"pool {name}: its settings must be an object")
        engine = {k: v for k, v in settings.items() if k != "replicas"}
        out.append(PoolSpec(name, settings.get("replicas", 1), {**POOL_DEFAULTS.get(name, {}), **engine}))
    return PoolsSpec(tuple(out))
