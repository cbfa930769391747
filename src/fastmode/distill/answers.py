"""The teacher's own greedy answers to the project's prompt set.

Distilling on the teacher's outputs (sequence-level distillation, Kim & Rush
2016) shows the student the chat format and the kind of text it will be asked
to produce, which the standard library and Shakespeare do not. Answers are
generated once with fastmode's own `LLM` API (continuous batching, greedy) and
cached in the output folder, one JSON line per prompt, written after every
batch: an interrupted run loses at most one batch, and a resumed run trains on
exactly the same answers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from fastmode.distill.corpus import Document

PROMPTS_FILE = "prompts.txt"


@dataclass(frozen=True)
class Answer:
    """One prompt with the teacher's answer, as token ids (the chat-rendered prompt, then the answer)."""

    prompt: str
    prompt_ids: tuple[int, ...]
    answer_ids: tuple[int, ...]
    text: str

    def document(self, eos_id: int | None) -> Document:
        """A training document of prompt + answer ids, closed with EOS if the answer was cut at max_tokens."""
        ids = self.prompt_ids + self.answer_ids
        if eos_id is not None and (not self.answer_ids or self.answer_ids[-1] != eos_id):
            ids += (eos_id,)
        return Document("answers", self.prompt[:60], f"{self.prompt}\n{self.text}", ids)


def load_prompts(path: Path | None = None) -> list[str]:
    """One prompt per line; blank lines and lines starting with '#' are skipped."""
    path = path or Path(str(resources.files("fastmode.distill").joinpath(PROMPTS_FILE)))
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _read_cache(path: Path, key: dict[str, Any]) -> dict[str, Answer]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not rows or rows[0].get("key") != key:
        return {}  # another teacher or another max_tokens: regenerate everything
    return {
        r["prompt"]: Answer(r["prompt"], tuple(r["prompt_ids"]), tuple(r["answer_ids"]), r["text"]) for r in rows[1:]
    }


def _write_cache(path: Path, key: dict[str, Any], answers: Sequence[Answer]) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps({"key": key}) + "\n")
        for a in answers:
            row = {"prompt": a.prompt, "prompt_ids": a.prompt_ids, "answer_ids": a.answer_ids, "text": a.text}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(path)


def teacher_answers(
    prompts: Sequence[str],
    cache_path: Path,
    teacher_key: dict[str, Any],
    model: str | None = None,
    max_tokens: int = 128,
    batch_size: int = 32,
) -> list[Answer]:
    """Answers for `prompts`, in order: from the cache where present, else generated greedily.

    `teacher_key` identifies the teacher (see export.teacher_identity); a cache
    made by another teacher is ignored. `batch_size` prompts go to the engine
    at once, which batches them continuously.
    """
    key = {"teacher": teacher_key, "max_tokens": max_tokens}
    done = _read_cache(cache_path, key)
    missing = [p for p in dict.fromkeys(prompts) if p not in done]
    if missing:
        from tqdm import tqdm

        from fastmode import LLM, SamplingParams

        llm = LLM(model, dtype="float32")
        params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        with tqdm(total=len(missing), desc="teacher answers", unit="prompt") as bar:
            for start in range(0, len(missing), batch_size):
                batch = missing[start : start + batch_size]
                ids = [llm.tokenizer.encode_chat([{"role": "user", "content": p}]) for p in batch]
                for p, pid, out in zip(batch, ids, llm.generate(ids, params)):
                    done[p] = Answer(p, tuple(pid), tuple(out.token_ids), out.text)
                _write_cache(cache_path, key, list(done.values()))
                bar.update(len(batch))
        del llm  # the engine holds a second copy of the teacher and its KV cache
    return [done[p] for p in prompts]
