"""Tokenizer and chat template, from a Hugging Face directory or GGUF metadata.

Tokenization is the `tokenizers` library; chat templates are rendered with
jinja2 in a sandbox with the same settings transformers uses (trim_blocks,
lstrip_blocks), so rendering matches `apply_chat_template` without importing
transformers at start-up.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from fastmode.loader.errors import ModelLoadError

Message = dict[str, Any]

# Pre-tokenizer splits by GGUF `tokenizer.ggml.pre`. The merges were learned on
# text split this way, so a wrong split silently changes tokenization.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_level_pre_tokenizer(pre: str):
    if pre == "smollm":  # SmolLM: every digit on its own, then GPT-2 byte-level splitting
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
    split = {"llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}.get(pre)
    if split is None:  # "gpt2", "default" and unknown: the GPT-2 regex built into ByteLevel
        return pre_tokenizers.ByteLevel(add_prefix_space=False)
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


class Tokenizer:
    """Encode, decode, special tokens and the chat template of one model."""

    def __init__(
        self,
        backend: HFTokenizer,
        *,
        bos_token_id: int | None,
        eos_token_ids: Sequence[int],
        add_bos: bool,
        chat_template: str | None,
    ):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = frozenset(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        # Extra variables the template is rendered with (Qwen3's `enable_thinking`); see with_template_variables.
        self.template_variables: dict[str, Any] = {}

    @property
    def has_thinking_switch(self) -> bool:
        """Whether the chat template turns a thinking block on and off (Qwen3's `enable_thinking`)."""
        return bool(self.chat_template) and "enable_thinking" in self.chat_template

    def with_template_variables(self, **variables: Any) -> Tokenizer:
        """This tokenizer, rendering its chat template with `variables` too (a shallow copy:
        the backend is shared, so a per-request copy costs nothing)."""
        view = copy.copy(self)
        view.template_variables = {**self.template_variables, **variables}
        return view

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return min(self.eos_token_ids) if self.eos_token_ids else None

    def token_to_str(self, token_id: int) -> str | None:
        return self.backend.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # encode_batch, unlike encode, releases the GIL while it runs: a long prompt tokenized on
        # a worker thread (as the server does) then leaves the event loop free.
        ids = self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        if add_special_tokens and self.add_bos and self.bos_token_id is not None and ids[:1] != [self.bos_token_id]:
            ids = [self.bos_token_id] + ids
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> str:
        """Render a conversation to the prompt text the model was trained on.

        Messages follow transformers' convention, tool calls included (assistant
        `tool_calls`, `tool` role); `tools` (function definitions, as transformers
        takes them) is passed to templates that render it, and left undefined otherwise.
        """
        if not self.chat_template:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        template = _compiled(self.chat_template)
        special = {
            "bos_token": self.token_to_str(self.bos_token_id) if self.bos_token_id is not None else "",
            "eos_token": self.token_to_str(self.eos_token_id) if self.eos_token_id is not None else "",
        }
        given = {"tools": list(tools)} if tools is not None else {}
        return template.render(
            messages=list(messages),
            add_generation_prompt=add_generation_prompt,
            **special,
            **self.template_variables,
            **given,
        )

    def encode_chat(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[dict] | None = None
    ) -> list[int]:
        # The template writes any BOS itself, so no special tokens are added on top.
        return self.encode(self.apply_chat_template(messages, add_generation_prompt, tools), add_special_tokens=False)


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    """A chat template compiled once per process (tokenizers and their per-request views share it)."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message: str) -> None:
        raise ValueError(f"chat template: {message}")

    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(source)


def _token_content(tok: Any) -> str | None:
    if isinstance(tok, dict):
        return tok.get("content")
    return tok


def tokenizer_from_hf_dir(path: Path, generation_eos: Sequence[int] = ()) -> Tokenizer:
    tok_file = path / "tokenizer.json"
    if not tok_file.exists():
        raise ModelLoadError(f"{path}: tokenizer.json is missing (fastmode needs the fast-tokenizer file)")
    backend = HFTokenizer.from_file(str(tok_file))
    cfg_file = path / "tokenizer_config.json"
    tcfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text()

    def tid(key: str) -> int | None:
        content = _token_content(tcfg.get(key))
        return backend.token_to_id(content) if content else None

    eos = [i for i in [tid("eos_token"), *generation_eos] if i is not None]
    # tokenizer.json's post-processor adds BOS itself where the model wants it.
    return Tokenizer(backend, bos_token_id=tid("bos_token"), eos_token_ids=eos, add_bos=False, chat_template=template)


# GGUF token types (llama.cpp's llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6
_GGUF_TOKENIZERS = ("gpt2", "llama")  # byte-level BPE; SentencePiece BPE


def check_gguf_tokenizer(meta: dict[str, Any], source: str = "GGUF file") -> None:
    """ModelLoadError unless `tokenizer_from_gguf` can read this file's tokenizer: called on the
    metadata before any weight is read, so an unreadable file fails at once."""
    kind = meta.get("tokenizer.ggml.model")
    if meta.get("tokenizer.ggml.tokens") is None:
        raise ModelLoadError(f"{source} has no tokenizer (tokenizer.ggml.tokens is missing)")
    if kind not in _GGUF_TOKENIZERS:
        raise ModelLoadError(
            f"{source}: GGUF tokenizer type {kind!r} is not supported; fastmode reads byte-level BPE ('gpt2': "
            "Llama 3, Qwen, SmolLM) and SentencePiece BPE ('llama': Gemma, Llama 2) tokenizers from GGUF. "
            "Use the model's Hugging Face directory instead."
        )


def _byte_level_backend(meta: dict[str, Any]) -> HFTokenizer:
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    backend = HFTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    backend.pre_tokenizer = _byte_level_pre_tokenizer(meta.get("tokenizer.ggml.pre", "default"))
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_backend(meta: dict[str, Any]) -> HFTokenizer:
    """SentencePiece BPE (Gemma, Llama 2) as a `tokenizers` BPE with byte fallback.

    The file lists pieces and scores but no merges: every split of a piece into two pieces
    is a merge, ranked by the piece's score (SentencePiece merges the best-scoring pair
    first). Gemma's files are the exception: their scores do not follow the merge order,
    the order of the pieces does, and a piece of two or more spaces is stored as spaces
    where the normalizer writes U+2581."""
    gemma = str(meta.get("general.architecture", "")).startswith("gemma")
    tokens = list(meta["tokenizer.ggml.tokens"])
    if gemma:
        tokens = ["\u2581" * len(t) if len(t) > 1 and not t.strip(" ") else t for t in tokens]
    types = meta.get("tokenizer.ggml.token_type") or [_NORMAL] * len(tokens)
    scores = meta.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    rank = {t: (i if gemma else -float(scores[i])) for i, t in enumerate(tokens)}
    pieces = [t for t, ty in zip(tokens, types) if ty == _NORMAL and len(t) > 1]  # control/byte/added: never merged
    merges = sorted(
        ((rank[t], vocab[t[:k]], vocab[t[k:]]), (t[:k], t[k:]))
        for t in pieces
        for k in range(1, len(t))
        if t[:k] in vocab and t[k:] in vocab
    )
    unk = next((t for t, ty in zip(tokens, types) if ty == _UNKNOWN), None)
    backend = HFTokenizer(
        models.BPE(vocab=vocab, merges=[m for _, m in merges], unk_token=unk, fuse_unk=True, byte_fallback=True)
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", not gemma))
    replace = normalizers.Replace(" ", "\u2581")
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), replace]) if prefix else replace
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return backend


def tokenizer_from_gguf(meta: dict[str, Any]) -> Tokenizer:
    check_gguf_tokenizer(meta)
    tokens = meta["tokenizer.ggml.tokens"]
    spm = meta.get("tokenizer.ggml.model") == "llama"
    backend = _sentencepiece_backend(meta) if spm else _byte_level_backend(meta)
    types = meta.get("tokenizer.ggml.token_type") or []
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == _CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == _USER_DEFINED]
    backend.add_special_tokens(control)
    if user:
        backend.add_tokens(user)
    eos = [meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta]
    if spm and "<end_of_turn>" in tokens:  # Gemma ends a chat turn with it; llama.cpp stops there too
        eos.append(tokens.index("<end_of_turn>"))
    return Tokenizer(
        backend,
        bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=eos,
        add_bos=bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
    )
