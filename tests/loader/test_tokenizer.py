"""Tokenizer round trips, agreement with transformers, chat-template rendering."""

from __future__ import annotations

import pytest

from fastmode.loader.default_model import default_model_path

TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing  ",
    "def f(x):\n\treturn {'a': [x, x]}\n",
    "Ünïcödé — naïve café, 日本語のテキスト, emoji 🚀🔥",
    "<|im_start|>user\nhi<|im_end|>",
    "line one\r\nline two\n\n\nthree",
]


@pytest.fixture(scope="module")
def ours(default_llm):
    return default_llm.tokenizer


@pytest.fixture(scope="module")
def theirs():
    from transformers import AutoTokenizer

    path = default_model_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.mark.parametrize("text", TEXTS + ["Numbers 1234567 and 3.14159"])
def test_round_trip(ours, text):
    assert ours.decode(ours.encode(text), skip_special_tokens=False) == text


@pytest.mark.parametrize("text", TEXTS)
def test_matches_transformers_gguf_tokenizer(ours, theirs, text):
    assert ours.encode(text) == theirs.encode(text, add_special_tokens=True)


def test_digits_are_split_like_the_original_smollm_tokenizer(ours):
    # SmolLM2 was trained with one token per digit (llama.cpp's "smollm" pre-tokenizer);
    # transformers' GGUF conversion does not apply that split, we do.
    ids = ours.encode("2024")
    assert len(ids) == 4 and ours.decode(ids) == "2024"


def test_special_tokens_stay_whole(ours):
    ids = ours.encode("<|im_start|>")
    assert ids == [ours.bos_token_id] == [1]
    assert 2 in ours.eos_token_ids


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is 2+2?"}],
        [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Write code."},
        ],
    ],
)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(ours, theirs, messages, add_generation_prompt):
    want = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    assert ours.apply_chat_template(messages, add_generation_prompt) == want


def test_hf_dir_chat_template_matches_transformers(tiny_llama_dir):
    from transformers import AutoTokenizer

    from fastmode.loader.tokenizer import tokenizer_from_hf_dir

    ours = tokenizer_from_hf_dir(tiny_llama_dir)
    theirs = AutoTokenizer.from_pretrained(str(tiny_llama_dir))
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "the quick brown fox"}]
    assert ours.apply_chat_template(msgs) == theirs.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )
    text = "def add(a, b):\n    return a + b"
    assert ours.encode(text) == theirs.encode(text)


def test_model_without_template_says_so(tiny_llama_dir, tmp_path):
    import json
    import shutil

    from fastmode.loader.tokenizer import tokenizer_from_hf_dir

    d = tmp_path / "notemplate"
    shutil.copytree(tiny_llama_dir, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="no chat template"):
        tokenizer_from_hf_dir(d).apply_chat_template([{"role": "user", "content": "x"}])
