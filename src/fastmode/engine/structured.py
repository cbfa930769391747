"""Structured outputs: grammars compiled with llguidance, and the token masks they give.

A request's `StructuredOutput` (JSON schema, any JSON object, regex or Lark)
is compiled once per (kind, spec) and tokenizer into a `CompiledGrammar`; each
request then gets its own `llguidance.LLMatcher` copied from it. While
decoding, the model runner asks for the allowed tokens of every constrained
row of a step at once (`fill_masks`: llguidance computes them on its own
threads without holding the GIL, while the forward pass runs) and `apply_mask`
sets every forbidden token's logit to -inf before sampling. When the grammar is complete the only allowed token is EOS.

Compilation is the expensive part (building the llguidance tokenizer takes
about a second, once per tokenizer; a grammar takes milliseconds): it runs
where the request is checked, on the caller's thread, never on the thread
that steps the engine.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import llguidance
import numpy as np
import torch

from fastmode.sampling_params import StructuredOutput

# How JSON is laid out under "json_schema" and "json_object": single spaces after ',' and ':'
# (what json.dumps writes), no other whitespace. Free whitespace lets a model pad the output
# with newlines until max_tokens; a schema may still override this with "x-guidance".
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_KIND_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object", "regex": "regex", "lark": "Lark grammar"}
_CACHE_SIZE = 256


class StructuredOutputError(ValueError):
    """A structured-output spec that cannot be compiled (bad schema, regex or grammar)."""


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A grammar ready to constrain decoding; `matcher()` gives each request its own state."""

    kind: str
    spec: str
    mask_words: int  # int32 words per token mask (32 token ids a word)
    eos_token_id: int  # what a matcher with nothing left to allow falls back to
    _template: llguidance.LLMatcher

    def matcher(self) -> llguidance.LLMatcher:
        """A fresh matcher at the start of the grammar (a copy: no recompilation)."""
        return self._template.deep_copy()


_tokenizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_grammars: OrderedDict[tuple[str, str, llguidance.LLTokenizer], CompiledGrammar] = OrderedDict()
_lock = threading.Lock()
_executor: llguidance.LLExecutor | None = None


def llg_tokenizer(tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of a fastmode `Tokenizer` (built from its `tokenizers` backend, with
    the model's EOS ids), once per tokenizer: building it takes about a second."""
    with _lock:
        tok = _tokenizers.get(tokenizer)
        if tok is None:
            eos = sorted(tokenizer.eos_token_ids)
            tok = llguidance.LLTokenizer(tokenizer.backend.to_str(), eos_token=eos or None)
            _tokenizers[tokenizer] = tok
        return tok


def _grammar_text(structured: StructuredOutput) -> str:
    kind, spec = structured.kind, structured.spec
    if kind == "json_schema":
        try:
            schema = json.loads(spec)
        except json.JSONDecodeError as e:
            raise StructuredOutputError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise StructuredOutputError("the JSON schema must be a JSON object")
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_LAYOUT)
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
    if kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(spec)
    if kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(spec)
    raise StructuredOutputError(f"unknown structured output kind {kind!r}; use json_schema, json_object, regex or lark")


def _one_sentence(error: str) -> str:
    """llguidance's error text (which may quote the grammar over several lines) as one line:
    the first line, plus the parser's own `error: ...` line where there is one."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    if not lines:
        return "unknown error"
    detail = next((ln for ln in lines[1:] if ln.startswith("error:")), None)
    first = lines[0].rstrip(":")
    return f"{first}: {detail.removeprefix('error:').strip()}" if detail else first


def compile_structured(structured: StructuredOutput, tokenizer) -> CompiledGrammar:
    """Compile `structured` for `tokenizer` (a fastmode `Tokenizer`), cached per (kind, spec)
    and tokenizer. Raises StructuredOutputError naming what is wrong."""
    if structured.kind in ("json_schema", "regex", "lark") and not structured.spec.strip():
        raise StructuredOutputError(f"the {_KIND_NAMES[structured.kind]} is empty")
    tok = llg_tokenizer(tokenizer)
    key = (structured.kind, structured.spec if structured.kind != "json_object" else "", tok)
    with _lock:
        hit = _grammars.get(key)
        if hit is not None:
            _grammars.move_to_end(key)
            return hit
    try:
        text = _grammar_text(structured)
    except StructuredOutputError:
        raise
    except ValueError as e:  # llguidance refusing the schema's shape before compiling it
        raise StructuredOutputError(f"invalid {_KIND_NAMES[structured.kind]}: {_one_sentence(str(e))}") from None
    # Building the matcher compiles the grammar (llguidance drops the GIL meanwhile) and
    # reports a bad schema, regex or grammar as an error state rather than an exception.
    template = llguidance.LLMatcher(tok, text, log_level=0)
    if template.is_error():
        name = _KIND_NAMES.get(structured.kind, structured.kind)
        raise StructuredOutputError(f"invalid {name}: {_one_sentence(template.get_error())}")
    compiled = CompiledGrammar(structured.kind, structured.spec, (tok.vocab_size + 31) // 32, tok.eos_token, template)
    with _lock:
        _grammars[key] = compiled
        _grammars.move_to_end(key)
        while len(_grammars) > _CACHE_SIZE:
            _grammars.popitem(last=False)
    return compiled


def _get_executor() -> llguidance.LLExecutor:
    global _executor
    if _executor is None:
        _executor = llguidance.LLExecutor()
    return _executor


def fill_masks(
    entries: list[tuple[llguidance.LLMatcher, int, list[int]]], num_rows: int, mask_words: int, parallel: bool = True
) -> torch.Tensor:
    """Token masks for a step's constrained rows, computed in parallel without the GIL.

    Each entry is (matcher, first row, drafts): row `first` gets the mask at the matcher's
    state and row `first + i + 1` the mask after drafts[:i + 1], as far as the grammar allows
    the drafts (rows past a draft it forbids stay all-zero: verification stops before them).
    The matchers are left as they were. Returns (num_rows, mask_words) int32 bitmasks.

    `parallel=False` computes draft-free masks one after another on the calling thread: for a
    few rows that is cheaper than waking llguidance's thread pool, whose threads would then
    compete with the forward pass's for the cores."""
    bitmask = torch.zeros(num_rows, mask_words, dtype=torch.int32)
    if not parallel and not any(drafts for _, _, drafts in entries):
        row_bytes = mask_words * 4
        for m, first, _ in entries:
            m.unsafe_compute_mask_ptr(bitmask.data_ptr() + first * row_bytes, row_bytes)
        return bitmask
    executor = _get_executor()
    plain = [(m, first) for m, first, drafts in entries if not drafts]
    speculative = [e for e in entries if e[2]]  # llguidance takes drafted matchers separately
    if plain:
        executor.unsafe_compute_mask_ptr(plain, bitmask.data_ptr(), mask_words * 4, num_rows)
    if speculative:
        executor.unsafe_compute_mask_ptr_with_draft_token(speculative, bitmask.data_ptr(), mask_words * 4, num_rows)
    return bitmask


_NEG_INF_BITS = np.float32(-np.inf).view(np.int32)


def mask_bounds(bitmask: torch.Tensor, vocab_size: int, eos_token_id: int | None) -> np.ndarray:
    """(rows, vocab_size) float32 upper bounds for the logits: +inf where a token is allowed,
    -inf where it is forbidden, so `min(logits, bounds)` masks a row in one pass. Ids past the
    tokenizer's vocabulary (a model's logits may be wider) are forbidden; a row that allows
    nothing (a matcher in an error state) allows EOS, so the request ends instead of emitting
    garbage."""
    if eos_token_id is not None:
        empty = ~bitmask.any(-1)
        if bool(empty.any()):
            bitmask = bitmask.clone()
            bitmask[empty, eos_token_id // 32] = 1 << (eos_token_id % 32)
    # Bit k of word w is token 32 * w + k: the words' little-endian bytes unpacked low bit first.
    words = bitmask.numpy().astype("<i4", copy=False).view(np.uint8)
    bits = np.unpackbits(words, axis=-1, bitorder="little")
    width = min(bits.shape[1], vocab_size)
    bounds = np.empty((bits.shape[0], vocab_size), dtype=np.int32)
    # Integer form of the floats: a set bit moved to the sign position and xor-ed with -inf's
    # pattern gives +inf, a clear bit leaves -inf. Four vectorised passes over the rows, about
    # 5x faster than indexing a {-inf, 0} table with the bits and adding it to the logits.
    np.left_shift(bits[:, :width], 31, out=bounds[:, :width], dtype=np.int32)
    bounds[:, :width] ^= _NEG_INF_BITS
    bounds[:, width:] = _NEG_INF_BITS
    return bounds.view(np.float32)


def apply_bounds(logits: torch.Tensor, bounds: np.ndarray) -> None:
    """Mask `logits` (rows, V) in place with `mask_bounds` rows of the same shape."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        rows = logits.numpy()
        np.minimum(rows, bounds, out=rows)
    else:
        logits.masked_fill_(torch.from_numpy(np.isneginf(bounds)).to(logits.device), float("-inf"))


def apply_mask(logits: torch.Tensor, bitmask: torch.Tensor, eos_token_id: int | None) -> None:
    """Set the logits of forbidden tokens to -inf, in place: (rows, V) fp32 logits, (rows, words)
    int32 bitmasks of allowed tokens (see `mask_bounds`)."""
    apply_bounds(logits, mask_bounds(bitmask, logits.shape[-1], eos_token_id))
