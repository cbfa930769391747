"""SentencePiece tokenizers from GGUF (Gemma 3's files), against transformers' reading of the
same file: merges recovered from the vocabulary, byte fallback, runs of spaces, special tokens."""

from __future__ import annotations

import pytest

from fastmode.loader.gguf_file import read_metadata
from fastmode.loader.tokenizer import tokenizer_from_gguf
from tests.builders import CORPUS

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "  leading spaces and    runs   of spaces",
    "Paris est la capitale de la France. Été, déjà vu: 日本語 ✓",
    "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n",
    "",
]


def write_spm_gguf(path) -> None:
    """A Gemma-3-like SentencePiece vocabulary: control tokens, the 256 byte tokens, pieces in
    merge order (as Gemma's files list them, with zero scores), a piece of four spaces stored as
    spaces, and the chat turn markers."""
    from gguf import GGUFWriter
    from tokenizers import SentencePieceBPETokenizer

    spm = SentencePieceBPETokenizer(add_prefix_space=False)
    spm.train_from_iterator(CORPUS, vocab_size=300, show_progress=False)
    trained = sorted(spm.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [3, 3, 3, 2] + [6] * 256
    for piece, _ in trained:
        if piece not in tokens:
            tokens.append(piece)
            types.append(1)
    for piece, kind in [("\u2581\u2581", 1), ("    ", 1), ("<start_of_turn>", 3), ("<end_of_turn>", 3)]:
        if piece not in tokens:
            tokens.append(piece)
            types.append(kind)
    w = GGUFWriter(str(path), "gemma3")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(16)
    w.add_head_count(1)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types(types)
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_unk_token_id(3)
    w.add_pad_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(False)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("spm") / "gemma-tokenizer.gguf"
    write_spm_gguf(path)
    return path


def ours(path):
    from gguf import GGUFReader

    return tokenizer_from_gguf(read_metadata(GGUFReader(str(path))))


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_gguf_matches_transformers(spm_gguf, text):
    import transformers

    theirs = transformers.AutoTokenizer.from_pretrained(str(spm_gguf.parent), gguf_file=spm_gguf.name)
    tok = ours(spm_gguf)
    assert tok.encode(text) == theirs(text)["input_ids"]
    assert tok.decode(tok.encode(text, add_special_tokens=False), skip_special_tokens=False) == text


def test_sentencepiece_gguf_ends_chat_turns(spm_gguf):
    tok = ours(spm_gguf)
    assert tok.bos_token_id == 2 and tok.add_bos
    assert tok.backend.token_to_id("<end_of_turn>") in tok.eos_token_ids and 1 in tok.eos_token_ids
    assert tok.encode("<end_of_turn>", add_special_tokens=False) == [tok.backend.token_to_id("<end_of_turn>")]
