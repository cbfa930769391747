"""What the bench sends: prompts, output budgets and tiers, drawn from a seed.

A `Workload` is an endless, reproducible sequence of `BenchRequest`s cut into
blocks. Within each block the tier counts are the mix's exact apportionment
(largest remainder), shuffled with the seed: a seeded run of 20 requests at
`fast=0.2,standard=0.8` sends exactly 4 fast and 16 standard requests, so two
runs compare the same traffic instead of two random draws of it. A run with a
request count uses that count as its block size; a run bounded by time uses
blocks of 100.

Prompt sets:
- "project":   the prompts shipped with the package (src/fastmode/distill/prompts.txt),
               picked at random; `input_len` is ignored.
- "synthetic": words drawn from a fixed list, `input_len` words per prompt.
               Common English words are about one token each for the BPE
               tokenizers of current models, so the prompt is *approximately*
               that many tokens (plus the chat template's few): the client does
               not tokenize, which keeps it model-agnostic. The server's
               `usage.prompt_tokens`, when sent, is the exact count.
- a file path: one prompt per line, blank lines and '#' comments skipped.

Output lengths are `max_tokens` budgets; a request only uses all of it when
the model does not stop first (`--ignore-eos` asks servers that support it to
keep going).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastmode.engine.tiers import Tier
from fastmode.sim.distributions import LengthDist
from fastmode.sim.workload import parse_tier_mix

PROMPT_SETS = ("project", "synthetic")
DURATION_BLOCK = 100  # tier mix is exact within every this many requests when the run is bounded by time

# Common short English words (one BPE token each in Llama 3, Qwen 2 and SmolLM tokenizers, with the leading space).
WORDS = tuple(
    dict.fromkeys(
        """
the of and to in is that it for was on are as with his they at be this from have or by one had not but what
all were when we there can an your which their said if do will each about how up out them then she many some
so these would other into has more her two like him see time could no make than first been its who now people
my made over did down only way find use may water long little very after words called just where most know
get through back much before go good new write our used me man too any day same right look think also around
another came come work three word must because does part even place well such here take why things help put
years different away again off went old number great tell men say small every found still between name should
home big give air line set own under read last never us left end along while might next sound below saw
something thought both few those always looked show large often together asked house world going want school
important until form food keep children feet land side without boy once animals life enough took sometimes
four head above kind began almost live page got earth need far hand high year mother light parts country father
let night following picture being study second eyes soon times story boys since white days ever paper hard near
sentence better best across during today others however sure means knew together family open river city tree
""".split()
    )
)


@dataclass(frozen=True)
class BenchRequest:
    """One request to send. `input_len` is the synthetic target (approximate tokens), None for text sets."""

    index: int
    tier: Tier
    prompt: str
    max_tokens: int
    input_len: int | None = None


def apportion(mix: Sequence[tuple[Tier, float]], n: int) -> list[int]:
    """Split `n` requests over the mix's shares, summing to exactly `n` (largest remainder).

    Ties in the remainders go to the tier listed first, so the split is a pure
    function of the mix and `n`.
    """
    exact = [share * n for _, share in mix]
    counts = [int(np.floor(x)) for x in exact]
    order = sorted(range(len(mix)), key=lambda i: (-(exact[i] - counts[i]), i))
    for i in order[: n - sum(counts)]:
        counts[i] += 1
    return counts


def synthetic_prompt(rng: np.random.Generator, num_words: int) -> str:
    """`num_words` words from WORDS joined by spaces: about that many tokens."""
    return " ".join(WORDS[i] for i in rng.integers(len(WORDS), size=max(1, num_words)))


def load_prompt_set(name: str) -> tuple[str, ...]:
    """The project's prompts, or a file's; () for "synthetic" (prompts are generated)."""
    from fastmode.distill.answers import load_prompts  # torch-free at module level

    if name == "synthetic":
        return ()
    prompts = load_prompts() if name == "project" else load_prompts(Path(name).expanduser())
    if not prompts:
        raise ValueError(f"prompt set {name!r} has no prompts")
    return tuple(prompts)


@dataclass(frozen=True)
class WorkloadConfig:
    """Everything that decides the requests. The same config always yields the same requests."""

    prompts: str = "project"  # "project", "synthetic" or a file path
    input_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    output_len: LengthDist = field(default_factory=lambda: LengthDist("fixed", 128))
    tier_mix: tuple[tuple[Tier, float], ...] = ((Tier.STANDARD, 1.0),)
    seed: int = 0
    block_size: int = DURATION_BLOCK

    def __post_init__(self) -> None:
        if isinstance(self.tier_mix, str):
            object.__setattr__(self, "tier_mix", parse_tier_mix(self.tier_mix))
        for name in ("input_len", "output_len"):
            if isinstance(getattr(self, name), (str, int)):
                object.__setattr__(self, name, LengthDist.parse(getattr(self, name)))
        if self.block_size < 1:
            raise ValueError("block_size must be >= 1")


class Workload:
    """An endless, seeded sequence of requests; `stream` separates warmup traffic from measured traffic.

    Block `b` of stream `s` is drawn from its own generator seeded with
    (seed, s, b), so the measured requests do not change when the number of
    warmup requests does, and any block can be rebuilt on its own.
    """

    def __init__(self, cfg: WorkloadConfig, stream: int = 0, prompts: Sequence[str] | None = None):
        self.cfg = cfg
        self.stream = stream
        self.prompts = tuple(prompts) if prompts is not None else load_prompt_set(cfg.prompts)

    def block(self, b: int) -> list[BenchRequest]:
        cfg, n = self.cfg, self.cfg.block_size
        rng = np.random.default_rng([cfg.seed, self.stream, b])
        tiers = np.repeat(np.arange(len(cfg.tier_mix)), apportion(cfg.tier_mix, n))
        rng.shuffle(tiers)
        outputs = cfg.output_len.sample(rng, n)
        synthetic = not self.prompts
        inputs = cfg.input_len.sample(rng, n) if synthetic else None
        picks = None if synthetic else rng.integers(len(self.prompts), size=n)
        out = []
        for i in range(n):
            if synthetic:
                prompt, in_len = synthetic_prompt(rng, int(inputs[i])), int(inputs[i])
            else:
                prompt, in_len = self.prompts[int(picks[i])], None
            out.append(BenchRequest(b * n + i, cfg.tier_mix[int(tiers[i])][0], prompt, int(outputs[i]), in_len))
        return out

    def __iter__(self) -> Iterator[BenchRequest]:
        b = 0
        while True:
            yield from self.block(b)
            b += 1

    def take(self, n: int) -> list[BenchRequest]:
        """The first `n` requests."""
        return list(itertools.islice(self, n))
