"""Each text checker accepts right answers and rejects wrong ones."""

from __future__ import annotations

import pytest

from fastmode.evals.checkers import (
    CHECKERS,
    check,
    first_integer,
    integers,
    normalize,
    truncate_body,
)


def test_normalize_strips_case_punctuation_and_accents() -> None:
    assert normalize("  Brasília!! ") == "brasilia"
    assert normalize("H2O.") == "h2o"
    assert normalize("Newton's law") == "newtons law"


@pytest.mark.parametrize(
    ("response", "aliases", "expected"),
    [
        ("The capital of France is Paris.", ["Paris"], True),
        ("paris", ["Paris"], True),
        ("It is Brasília.", ["Brasilia"], True),
        ("Leonardo da Vinci painted it.", ["Leonardo", "da Vinci"], True),
        ("Carbon dioxide, CO2.", ["carbon dioxide"], True),
        ("The capital of France is Lyon.", ["Paris"], False),
        ("A spider has 80 legs.", ["8", "eight"], False),  # whole words only
        ("I like marshmallows.", ["mars"], False),
        ("", ["Paris"], False),
    ],
)
def test_contains_any(response: str, aliases: list[str], expected: bool) -> None:
    assert check("contains_any", response, {"aliases": aliases}) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12", [12]),
        ("The answer is 42.", [42]),
        ("-3 degrees", [-3]),
        ("x = -3", [-3]),
        ("1,024 bytes", [1024]),
        ("3, 4 or 5", [3, 4, 5]),
        ("22-4=18", [22, 4, 18]),
        ("about 5.55 or 2.0", []),
        ("no digits", []),
    ],
)
def test_integers(text: str, expected: list[int]) -> None:
    assert integers(text) == expected


def test_first_integer_skips_ignored() -> None:
    assert first_integer("7 apples and 9 pears") == 7
    assert first_integer("7 times 7 is 49.", ignore=[7]) == 49
    assert first_integer("none", ignore=[1]) is None


def test_integer_equals() -> None:
    assert check("integer_equals", "The answer is 12.", {"answer": 12})
    assert check("integer_equals", "12", {"answer": 12})
    assert not check("integer_equals", "13", {"answer": 12})
    assert not check("integer_equals", "twelve", {"answer": 12})
    assert not check("integer_equals", "5 + 7 = 12", {"answer": 12})  # first integer is 5
    # ... unless the 5 and 7 are the question's operands, echoed back
    args = {"answer": 12, "ignore": [5, 7]}
    assert check("integer_equals", "5 + 7 = 12", args)
    assert not check("integer_equals", "5 + 7 = 13", args)
    assert not check("integer_equals", "5 + 7 = 12.5", args)
    assert not check("integer_equals", "5 + 7", args)


@pytest.mark.parametrize(
    ("checker", "args", "good", "bad"),
    [
        ("one_word", {"aliases": ["blue"]}, "Blue.", "The sky is blue."),
        ("one_word", {"aliases": ["blue"]}, "blue", "red"),
        ("one_word", {}, "Vast", "Very vast"),
        ("all_caps", {}, "HELLO TEAM!", "Hello team!"),
        ("all_caps", {}, "HI THERE 2", "OK"),  # too few letters to count as following
        ("all_lowercase", {}, "dogs are loyal friends.", "Dogs are loyal friends."),
        ("yes_no", {"answer": "yes"}, "Yes.", "No."),
        ("yes_no", {"answer": "no"}, "no", "No, cats do not bark."),
        (
            "json_keys",
            {"keys": ["name"], "values": {"name": "Alice"}},
            '```json\n{"name": "Alice"}\n```',
            '{"name": "Bob"}',
        ),
        ("json_keys", {"keys": ["x"], "values": {"x": 5}}, '{"x": 5}', '{"x": "5"}'),
        (
            "json_keys",
            {"keys": ["city", "country"]},
            'Here: {"city": "Paris", "country": "France"}',
            '{"city": "Paris"}',
        ),
        ("json_keys", {"keys": ["a"]}, '{"a": 1}', "a: 1"),
        ("comma_list", {"count": 3}, "red, green, blue", "red, green"),
        ("comma_list", {"count": 3}, "red, green, blue.", "red\ngreen, blue, pink"),
        (
            "comma_list",
            {"count": 2},
            "France, Spain",
            "I think that France is nice, and also Spain is a lovely country",
        ),
        ("numbered_list", {"count": 3}, "1. cat\n2. dog\n3. cow", "1. cat\n2. dog"),
        ("numbered_list", {"count": 2}, "1. carrot\n\n2. pea", "- carrot\n- pea"),
        ("max_words", {"max": 5}, "A hot bright star.", "The Sun is a very hot and bright star."),
        ("starts_with", {"prefix": "Sure"}, "Sure, it is 4.", "Of course! Sure."),
        ("ends_with", {"suffix": "STOP"}, "The Moon has craters. STOP.", "STOP. The Moon has craters."),
        ("ends_with", {"suffix": "Have a nice day"}, "Good morning! Have a nice day!", "Have a nice day, friend"),
        ("no_letter", {"letter": "e"}, "A cat sat on a mat.", "The cat sat."),
    ],
)
def test_format_checkers(checker: str, args: dict, good: str, bad: str) -> None:
    assert check(checker, good, args), good
    assert not check(checker, bad, args), bad


def test_unknown_checker_raises() -> None:
    with pytest.raises(ValueError, match="unknown checker"):
        check("no_such_checker", "x", {})


def test_every_checker_rejects_empty_answer() -> None:
    """An empty generation must never count as correct, whatever the checker."""
    args = {
        "contains_any": {"aliases": ["x"]},
        "integer_equals": {"answer": 0},
        "one_word": {},
        "all_caps": {},
        "all_lowercase": {},
        "yes_no": {"answer": "yes"},
        "json_keys": {"keys": ["a"]},
        "comma_list": {"count": 1},
        "max_words": {"max": 3},
        "starts_with": {"prefix": "A"},
        "ends_with": {"suffix": "A"},
        "numbered_list": {"count": 1},
        "no_letter": {"letter": "e"},
        "code_exec": {"tests": ["assert f() == 1"], "reference": "    return 1\n"},
    }
    assert set(args) == set(CHECKERS)
    for name, checker_args in args.items():
        prompt = "def f():\n" if name == "code_exec" else ""
        assert not check(name, "", checker_args, prompt), name


def test_truncate_body_stops_at_top_level_code() -> None:
    completion = "    return a + b\n\n\nprint(add(1, 2))\ndef other():\n    pass\n"
    assert truncate_body(completion) == "    return a + b\n"
    assert truncate_body("    x = 1\n\n    return x\n```\n") == "    x = 1\n\n    return x\n"
