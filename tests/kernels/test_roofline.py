"""The memory roofline the peer benchmarks print beside every decode figure, and how they pair
figures measured in the same round."""

from __future__ import annotations

import pytest

from benchmarks.kernels import decode_bytes_per_step, roofline_tok_s
from benchmarks.peers import combine_rounds, parse_args


@pytest.fixture(scope="module")
def model() -> str:
    from fastmode.loader.default_model import default_model_path

    return str(default_model_path())


def test_a_decode_step_reads_every_weight_once_and_each_sequences_kv(model):
    import gguf

    tensors = gguf.GGUFReader(model).tensors
    assert "output.weight" not in {t.name for t in tensors}  # the head is the tied embedding: read whole every step
    one = decode_bytes_per_step(model, 1, 100)
    assert one["weights"] == sum(int(t.n_bytes) for t in tensors)
    # SmolLM2-135M: 30 layers, 3 KV heads of 64 values, K and V, fp16
    assert one["kv_per_token"] == 30 * 2 * 3 * 64 * 2
    assert one["kv"] == 100 * one["kv_per_token"]
    sixteen = decode_bytes_per_step(model, 16, 100)
    assert sixteen["weights"] == one["weights"] and sixteen["kv"] == 16 * one["kv"]
    assert roofline_tok_s(30.0, model, 16, 100) == pytest.approx(16 * 30e9 / sixteen["total"])


def test_rounds_pair_each_figure_with_the_peer_of_its_own_round(model):
    args = parse_args(["--batches", "1", "--rounds", "3"])
    info = {"path": model}

    def res(name, tok_s):
        return {"engine": name, "precision": "p", "rows": [{"batch": 1, "decode_tok_s": tok_s, "prefill_tok_s": 1.0}]}

    rounds = [
        {"dram_read_gbs": bw, "results": {"llama.cpp": res("llama.cpp", ll), "fastmode": res("fastmode", fm)}}
        for bw, ll, fm in ((30.0, 50.0, 100.0), (20.0, 40.0, 60.0), (25.0, 100.0, 110.0))
    ]
    fm = next(e for e in combine_rounds(rounds, args, info) if e["engine"] == "fastmode")["rows"][0]
    assert fm["vs_llama_cpp_by_round"] == [2.0, 1.5, 1.1]
    assert fm["vs_llama_cpp"] == 1.5  # the median of the rounds' own ratios, not a ratio of medians (100 / 50)
    assert fm["decode_tok_s"] == 100.0
    context = args.npp + (args.ntg + 1) / 2
    assert fm["roofline_fraction_by_round"][1] == pytest.approx(60.0 / roofline_tok_s(20.0, model, 1, context))
