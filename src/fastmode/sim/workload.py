"""Workloads: what requests arrive, when, how long, in which tier.

A workload is a list of `RequestSpec`, generated from a seeded
`WorkloadConfig` or loaded from a JSONL file (one request per line):

    {"id": "r0", "arrival_s": 0.31, "prompt_tokens": 512, "output_tokens": 128, "tier": "fast"}

Optional keys `prefix_group` (int) and `prefix_tokens` (int) make requests of
one group share their first `prefix_tokens` prompt tokens, so the prefix cache
can serve them (multi-turn chats, agents with one system prompt).
Outputs are lengths, not text: the simulator and the replay driver stop every
request after exactly `output_tokens` tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastmode.engine.tiers import Tier
from fastmode.sim.distributions import ArrivalProcess, LengthDist

_JSON_KEYS = {"id", "arrival_s", "prompt_tokens", "output_tokens", "tier", "prefix_group", "prefix_tokens"}


@dataclass(frozen=True)
class RequestSpec:
    """One request. Times in seconds from the start of the run, lengths in tokens."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tier: Tier = Tier.STANDARD
    prefix_group: int | None = None
    prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.arrival_s < 0 or self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError(f"{self.request_id}: needs arrival_s >= 0, prompt_tokens >= 1, output_tokens >= 1")
        if self.prefix_tokens < 0 or self.prefix_tokens > self.prompt_tokens:
            raise ValueError(f"{self.request_id}: prefix_tokens must be in [0, prompt_tokens]")

    def prompt_token_ids(self, index: int) -> list[int]:
        """Synthetic prompt ids: a group's shared prefix, then tokens unique to this request.

        The simulator never looks tokens up in a vocabulary; the ids only have to
        make the prefix cache hit exactly where the workload says it should.
        `index` (unique per request in a run) makes the private part unique.
        """
        shared = self.prefix_tokens if self.prefix_group is not None else 0
        ids = [0] * self.prompt_tokens  # built in place: one list of prompt length per request
        if shared:
            ids[0] = -1 - self.prefix_group
        if shared < self.prompt_tokens:
            ids[shared] = 1_000_000 + index
        return ids

    def to_json(self) -> dict:
        d = {
            "id": self.request_id,
            "arrival_s": self.arrival_s,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "tier": self.tier.value,
        }
        if self.prefix_group is not None:
            d.update(prefix_group=self.prefix_group, prefix_tokens=self.prefix_tokens)
        return d

    @classmethod
    def from_json(cls, d: dict) -> RequestSpec:
        unknown = set(d) - _JSON_KEYS
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} (known: {sorted(_JSON_KEYS)})")
        group = d.get("prefix_group")
        return cls(
            str(d["id"]),
            float(d["arrival_s"]),
            int(d["prompt_tokens"]),
            int(d["output_tokens"]),
            Tier.parse(d.get("tier")),
            None if group is None else int(group),
            int(d.get("prefix_tokens", 0)),
        )


def parse_tier_mix(text: str) -> tuple[tuple[Tier, float], ...]:
    """'fast=0.1,standard=0.8,flex=0.1' -> normalised ((Tier, share), ...)."""
    pairs = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, share = part.partition("=")
        try:
            pairs.append((Tier.parse(name.strip()), float(share)))
        except ValueError as e:
            raise ValueError(f"bad tier mix entry {part!r}: use TIER=SHARE ({e})") from None
    total = sum(s for _, s in pairs)
    if not pairs or total <= 0 or any(s < 0 for _, s in pairs):
        raise ValueError(f"tier mix {text!r} needs non-negative shares with a positive sum")
    return tuple((t, s / total) for t, s in pairs)


@dataclass(frozen=True)
class WorkloadConfig:
    """A seeded synthetic workload. The same config always yields the same requests."""

    num_requests: int = 1000
    arrival: ArrivalProcess = field(default_factory=ArrivalProcess)
    prompt_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 512))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    tier_mix: tuple[tuple[Tier, float], ...] = ((Tier.STANDARD, 1.0),)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests < 1:
            raise ValueError("num_requests must be >= 1")
        if isinstance(self.tier_mix, str):
            object.__setattr__(self, "tier_mix", parse_tier_mix(self.tier_mix))


def generate_workload(cfg: WorkloadConfig) -> list[RequestSpec]:
    """Draw `cfg.num_requests` requests, sorted by arrival time."""
    rng = np.random.default_rng(cfg.seed)
    n = cfg.num_requests
    arrivals = cfg.arrival.sample(rng, n)
    prompts = cfg.prompt_len.sample(rng, n)
    outputs = cfg.output_len.sample(rng, n)
    tiers = [t for t, _ in cfg.tier_mix]
    picks = rng.choice(len(tiers), size=n, p=[s for _, s in cfg.tier_mix])
    return [
        RequestSpec(f"r{i}", float(a), int(p), int(o), tiers[k])
        for i, (a, p, o, k) in enumerate(zip(arrivals, prompts, outputs, picks))
    ]


def save_jsonl(requests: list[RequestSpec], path: str | Path) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps(r.to_json()) + "\n")


def load_jsonl(path: str | Path) -> list[RequestSpec]:
    """Read a workload file; blank lines and lines starting with '#' are skipped."""
    out = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                out.append(RequestSpec.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{lineno}: {e}") from None
    if len({r.request_id for r in out}) != len(out):
        raise ValueError(f"{path}: request ids must be unique")
    return sorted(out, key=lambda r: r.arrival_s)
