"""Deterministic answer checkers for the eval suite.

A checker is a pure function `(response, args, prompt) -> bool`: `response` is
the model's generated text, `args` the checker arguments stored with the task,
and `prompt` the text the model saw (only the code checker needs it, because
the model completes a function whose signature is in the prompt). Checkers are
looked up by name in `CHECKERS`, so a task file names its checker as data.

No checker calls a model or the network; all but `code_exec` are pure string
predicates and run in microseconds.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Callable, Collection, Mapping
from typing import Any

from fastmode.evals.sandbox import run_python

Checker = Callable[[str, Mapping[str, Any], str], bool]

_WORD_RE = re.compile(r"[A-Za-z0-9']+")
# A run of digits, with thousands separators ("1,024") taken as one number.
_DIGITS_RE = re.compile(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+")


def normalize(text: str) -> str:
    """Lower-case, strip accents, turn punctuation into spaces, collapse whitespace.

    Used on both the response and the aliases so "Paris." matches "paris",
    "Brasília" matches "brasilia" and "H2O" matches "h2o"; apostrophes are
    dropped rather than spaced so "Newton's" becomes "newtons" on both sides.
    """
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c))
    text = text.lower().replace("'", "").replace("\u2019", "")
    text = re.sub(r"[^a-z0-9]+", " ", text)
    return " ".join(text.split())


def contains_any(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """True if one of `args["aliases"]` occurs in the response as whole words.

    Matching is on word boundaries of the normalized text, so the alias "4"
    does not match "40" and "mars" does not match "marshmallow".
    """
    padded = f" {normalize(response)} "
    return any(f" {normalize(alias)} " in padded for alias in args["aliases"])


def integers(text: str) -> list[int]:
    """The integers written in digits in `text`, in order.

    Parts of decimals are not integers ("5.55" holds none), and a minus sign
    is a sign only where it cannot be a subtraction: "-3" and "= -3" are
    negative, the 4 in "22-4" is not.
    """
    found = []
    for match in _DIGITS_RE.finditer(text):
        start, end = match.span()
        before = text[start - 1] if start else ""
        if before == "." or (text[end : end + 1] == "." and text[end + 1 : end + 2].isdigit()):
            continue
        value = int(match.group(0).replace(",", ""))
        if before == "-":
            prev = text[start - 2] if start >= 2 else ""
            if not (prev.isalnum() or prev == ")"):
                value = -value
        found.append(value)
    return found


def first_integer(text: str, ignore: Collection[int] = ()) -> int | None:
    """The first integer in `text` that is not in `ignore`, or None."""
    return next((n for n in integers(text) if n not in ignore), None)


def integer_equals(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """True if the first integer in the response equals `args["answer"]`.

    Integers in `args["ignore"]` (the question's own operands) are skipped:
    small models echo the question ("7 times 7 is 49"), and the echo is not
    an answer. The generator guarantees the answer is never an operand, so
    skipping cannot hide a right answer; a wrong one ("7 times 7 is 14")
    still fails.
    """
    return first_integer(response, args.get("ignore", ())) == int(args["answer"])


def _words(text: str) -> list[str]:
    return _WORD_RE.findall(text)


def one_word(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Exactly one word (trailing punctuation allowed); optionally one of `args["aliases"]`."""
    words = _words(response)
    if len(words) != 1:
        return False
    aliases = args.get("aliases")
    return aliases is None or normalize(words[0]) in {normalize(a) for a in aliases}


def all_caps(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Has at least `args["min_letters"]` (default 3) letters and none is lower case."""
    letters = [c for c in response if c.isalpha()]
    return len(letters) >= int(args.get("min_letters", 3)) and not any(c.islower() for c in letters)


def all_lowercase(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Has at least `args["min_letters"]` (default 3) letters and none is upper case."""
    letters = [c for c in response if c.isalpha()]
    return len(letters) >= int(args.get("min_letters", 3)) and not any(c.isupper() for c in letters)


def yes_no(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """The response is just "yes" or "no" (any case, trailing punctuation) and equals `args["answer"]`."""
    return normalize(response) == str(args["answer"]).lower()


def _first_json_object(text: str) -> Any:
    """Parse the first JSON object in `text`; models often wrap it in prose or ``` fences."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def json_keys(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """The response contains a JSON object with all of `args["keys"]`.

    If `args["values"]` is given it maps keys to expected values; strings are
    compared after `normalize`, other values by equality.
    """
    obj = _first_json_object(response)
    if obj is None or not all(key in obj for key in args["keys"]):
        return False
    for key, expected in args.get("values", {}).items():
        actual = obj.get(key)
        if isinstance(expected, str):
            if not isinstance(actual, str) or normalize(actual) != normalize(expected):
                return False
        elif actual != expected:
            return False
    return True


def comma_list(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """A single line of exactly `args["count"]` non-empty comma-separated items.

    Items are short (at most `args["max_words_per_item"]` words, default 4) so
    that a sentence with commas in it does not count as a list.
    """
    text = response.strip().rstrip(".")
    if "\n" in text:
        return False
    items = [item.strip() for item in text.split(",")]
    max_words = int(args.get("max_words_per_item", 4))
    return len(items) == int(args["count"]) and all(items) and all(len(_words(item)) <= max_words for item in items)


def max_words(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """At least one and at most `args["max"]` words."""
    return 1 <= len(_words(response)) <= int(args["max"])


def starts_with(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """The stripped response starts with `args["prefix"]` (case-sensitive)."""
    return response.strip().startswith(args["prefix"])


def ends_with(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """The response ends with `args["suffix"]` (case-sensitive).

    Trailing whitespace and a final "." or "!" are ignored unless the suffix
    itself ends with one, so "... STOP." counts as ending with "STOP".
    """
    suffix = args["suffix"]
    text = response.strip()
    if not suffix.endswith((".", "!")):
        text = text.rstrip(".!").rstrip()
    return text.endswith(suffix)


def numbered_list(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Exactly `args["count"]` lines that start "1.", "2.", ... in order (blank lines ignored)."""
    lines = [line.strip() for line in response.strip().splitlines() if line.strip()]
    if len(lines) != int(args["count"]):
        return False
    return all(line.startswith(f"{i}.") and line[len(f"{i}.") :].strip() for i, line in enumerate(lines, start=1))


def no_letter(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Non-empty and never uses the letter `args["letter"]` (either case)."""
    letter = str(args["letter"]).lower()
    return bool(_words(response)) and letter not in response.lower()


def truncate_body(completion: str) -> str:
    """Keep the function body: stop at the first non-blank, non-indented line.

    The model continues past the function (a second def, example calls,
    prose); like HumanEval's post-processing we keep only the indented block,
    and drop a closing code fence.
    """
    kept: list[str] = []
    for line in completion.splitlines():
        if line.strip() and not line[0].isspace():
            break
        kept.append(line)
    return "\n".join(kept).rstrip() + "\n"


def code_exec(response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Run `prompt + body + tests` in the sandbox; pass if it exits 0 in time.

    Prompts end at the closing docstring quotes with no newline: BPE
    tokenizers merge "newline + indentation" into one token, so a prompt
    ending in a bare newline forces a token split the model rarely saw and it
    stops writing code. The body therefore usually starts with a newline;
    we join on exactly one. `args["tests"]` are statements (asserts) run after
    the function is defined; `args["timeout_s"]` defaults to 5 seconds.
    """
    body = truncate_body(response).lstrip("\n")
    program = prompt.rstrip("\n") + "\n" + body + "\n" + "\n".join(args["tests"]) + "\n"
    result = run_python(program, timeout_s=float(args.get("timeout_s", 5.0)))
    return result.ok


CHECKERS: dict[str, Checker] = {
    "contains_any": contains_any,
    "integer_equals": integer_equals,
    "one_word": one_word,
    "all_caps": all_caps,
    "all_lowercase": all_lowercase,
    "yes_no": yes_no,
    "json_keys": json_keys,
    "comma_list": comma_list,
    "max_words": max_words,
    "starts_with": starts_with,
    "ends_with": ends_with,
    "numbered_list": numbered_list,
    "no_letter": no_letter,
    "code_exec": code_exec,
}


def check(checker: str, response: str, args: Mapping[str, Any], prompt: str = "") -> bool:
    """Run the named checker; an unknown name is a bug in the task file, so it raises."""
    try:
        fn = CHECKERS[checker]
    except KeyError:
        raise ValueError(f"unknown checker {checker!r}; known: {sorted(CHECKERS)}") from None
    return fn(response, args, prompt)
