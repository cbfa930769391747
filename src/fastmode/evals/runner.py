"""Run the task suite against one `fastmode.LLM` and summarize it.

`evaluate` uses only the public API: `SamplingParams`, `llm.generate`,
`llm.tokenizer` (`encode_chat` or `apply_chat_template`, `encode`) and
`llm.score` for perplexity. Items are generated greedily in batched
`generate` calls, so the outputs are deterministic and a speculative run can
be compared token for token with the plain run (lossless speculative decoding
must give identical text).
"""

from __future__ import annotations

import inspect
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fastmode.evals.perplexity import PerplexityResult, heldout_perplexity
from fastmode.evals.stats import ChainSuccess, Proportion, chain_success, proportion
from fastmode.evals.tasks import CATEGORIES, Task

# A completion-mode code item ends where the next top-level statement would
# start; these cover what small models usually write after a function.
CODE_STOP = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\nassert ", "\n#", "\n```"]

# Prompts for the batch-1 speed probe: one prose, one list, one code edit
# (the last repeats its input, which is where n-gram speculation pays).
SPEED_PROMPTS = [
    "Write a short story about a lighthouse keeper.",
    "List ten fruits and one fact about each.",
    "Rename the variable x to total in this code:\n\ndef f(items):\n    x = 0\n"
    "    for i in items:\n        x += i\n    return x\n",
]


@dataclass(frozen=True)
class ItemResult:
    """One task's outcome; `response` is the generated text as checked."""

    id: str
    category: str
    passed: bool
    response: str
    num_tokens: int


@dataclass
class ModelReport:
    """Everything `evaluate` measured for one model (and speculative mode)."""

    name: str
    speculative: str | None
    items: list[ItemResult]
    accuracy: Proportion
    per_category: dict[str, Proportion]
    chain: ChainSuccess
    decode_tok_s: float | None = None
    perplexity: dict[str, PerplexityResult] | None = None
    generate_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "speculative": self.speculative,
            "accuracy": self.accuracy.to_dict(),
            "per_category": {c: p.to_dict() for c, p in self.per_category.items()},
            "chain": self.chain.to_dict(),
            "decode_tok_s": self.decode_tok_s,
            "perplexity": ({k: v.to_dict() for k, v in self.perplexity.items()} if self.perplexity else None),
            "generate_s": self.generate_s,
            "notes": self.notes,
            "items": [vars(item) for item in self.items],
        }


def sampling_params(speculative: str | None, **kwargs: Any) -> Any:
    """Greedy `SamplingParams` that state the speculative mode explicitly.

    The mode travels in `SamplingParams.speculative`. The baseline asks for
    "off" rather than leaving it None, because None means "the server's
    default", which may itself be speculative. If this engine's
    SamplingParams has no such field, a speculative run cannot be honoured
    and raises; a plain run simply omits it.
    """
    from fastmode import SamplingParams  # the engine, imported only when evaluating

    if _has_field(SamplingParams, "speculative"):
        kwargs["speculative"] = speculative or "off"
    elif speculative not in (None, "off"):
        raise NotImplementedError(
            f"SamplingParams has no 'speculative' field, so speculative={speculative!r} "
            "cannot be requested; run with --speculative off"
        )
    return SamplingParams(temperature=0.0, **kwargs)


def _has_field(cls: Any, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


def build_prompts(llm: Any, tasks: Sequence[Task]) -> list[Any]:
    """Chat items through the model's chat template, completion items as raw text.

    If any prompt comes back as token ids, every prompt is turned into ids
    so the batch has one prompt type.
    """
    prompts = [chat_prompt(llm, t.prompt) if t.mode == "chat" else t.prompt for t in tasks]
    return _one_prompt_type(llm, prompts)


def chat_prompt(llm: Any, user_text: str) -> Any:
    """A single user turn rendered by the model's chat template, ready for generation.

    Prefers `tokenizer.encode_chat` (what `llm.chat` uses): the template
    writes its own BOS, so encoding the rendered text again with special
    tokens could add a second one.
    """
    messages = [{"role": "user", "content": user_text}]
    encode_chat = getattr(llm.tokenizer, "encode_chat", None)
    if callable(encode_chat):
        return list(encode_chat(messages, add_generation_prompt=True))
    return llm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)


def _one_prompt_type(llm: Any, prompts: list[Any]) -> list[Any]:
    """All strings, or all token-id lists if any prompt already is one."""
    if any(not isinstance(p, str) for p in prompts):
        prompts = [llm.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
    return prompts


def measure_decode_tok_s(llm: Any, speculative: str | None = None, num_tokens: int = 64) -> float:
    """Batch-1 decode speed in output tokens/s, prefill excluded.

    For each probe prompt we time a 1-token and an N-token generation; the
    difference is N-1 decode steps, so (N-1)/(t_N - t_1) is the decode rate
    without time-to-first-token. The median over prompts is reported.
    """
    prompts = _one_prompt_type(llm, [chat_prompt(llm, p) for p in SPEED_PROMPTS])
    one = sampling_params(speculative, max_tokens=1, ignore_eos=True)
    many = sampling_params(speculative, max_tokens=num_tokens, ignore_eos=True)
    llm.generate(prompts[:1], many)  # warm-up: allocation, kernels, caches
    rates = []
    for prompt in prompts:
        start = time.perf_counter()
        llm.generate([prompt], one)
        first_s = time.perf_counter() - start
        start = time.perf_counter()
        out = llm.generate([prompt], many)[0]
        total_s = time.perf_counter() - start
        decode_s = max(total_s - first_s, 1e-9)
        rates.append((len(out.token_ids) - 1) / decode_s)
    return statistics.median(rates)


def summarize(name: str, speculative: str | None, items: list[ItemResult], chain_steps: int = 10) -> ModelReport:
    """Accuracy overall and per category (Wilson 95%) and the p^n chain."""
    overall = proportion(sum(i.passed for i in items), len(items))
    per_category = {}
    for category in CATEGORIES:
        in_cat = [i for i in items if i.category == category]
        if in_cat:
            per_category[category] = proportion(sum(i.passed for i in in_cat), len(in_cat))
    return ModelReport(
        name=name,
        speculative=speculative,
        items=items,
        accuracy=overall,
        per_category=per_category,
        chain=chain_success(overall, chain_steps),
    )


def evaluate(
    llm: Any,
    tasks: Sequence[Task],
    speculative: str | None = None,
    *,
    name: str = "model",
    measure_speed: bool = True,
    measure_perplexity: bool = True,
    chain_steps: int = 10,
    batch_size: int | None = None,
) -> ModelReport:
    """Generate greedily for every task, check each answer, and measure.

    `speculative` ("ngram", "draft", or None/"off") is passed through in
    `SamplingParams.speculative`. `batch_size` caps the prompts per `generate`
    call (None: all at once). Speed and perplexity can be skipped for quick
    runs; perplexity raises NotImplementedError if the LLM has no `score`.
    """
    prompts = build_prompts(llm, tasks)
    params = [
        sampling_params(
            speculative,
            max_tokens=task.max_tokens,
            stop=CODE_STOP if task.mode == "completion" else None,
        )
        for task in tasks
    ]
    # Chunks of `batch_size` prompts: the engine turns speculation off for
    # steps with more than a few sequences, so a speculative run must keep its
    # batches small for speculation to happen at all.
    step = batch_size or max(1, len(prompts))
    outputs: list[Any] = []
    start = time.perf_counter()
    for i in range(0, len(prompts), step):
        outputs.extend(llm.generate(prompts[i : i + step], params[i : i + step]))
    generate_s = time.perf_counter() - start
    items = []
    for task, out in zip(tasks, outputs, strict=True):
        # Chat answers are judged without surrounding whitespace; code keeps
        # its leading indentation because the body must line up.
        text = out.text if task.mode == "completion" else out.text.strip()
        items.append(ItemResult(task.id, task.category, task.check(text), text, len(out.token_ids)))
    report = summarize(name, speculative, items, chain_steps)
    report.generate_s = generate_s
    if measure_speed:
        report.decode_tok_s = measure_decode_tok_s(llm, speculative)
    if measure_perplexity:
        report.perplexity = heldout_perplexity(llm)
    else:
        report.notes.append("perplexity not measured")
    return report


def agreement(baseline: ModelReport, other: ModelReport) -> Proportion:
    """Share of items whose text is identical in both runs (same task ids).

    With greedy decoding a lossless speculative decoder must reach 100%; a
    lower number is a correctness bug, not a quality trade-off (up to rare
    numeric ties between near-equal logits).
    """
    by_id = {i.id: i.response for i in baseline.items}
    shared = [i for i in other.items if i.id in by_id]
    return proportion(sum(by_id[i.id] == i.response for i in shared), len(shared))
