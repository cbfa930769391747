"""What ended a request is recorded where it happened and reported on its last output:
the token id (EOS, stop token) or the stop string of a "stop" finish, the limit of a "length" one."""

from __future__ import annotations

import pytest

from fastmode import LLM, SamplingParams
from fastmode.engine.llm_engine import RequestOutput
from fastmode.server.generation import stop_details

PROMPT = [100]
GREEDY = dict(temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, max_model_len=48)


def last(llm, params: SamplingParams, prompt=PROMPT) -> RequestOutput:
    rid = llm.engine.add_request(prompt, params)
    final = None
    while llm.engine.has_unfinished():
        for o in llm.engine.step():
            if o.request_id == rid and o.finished:
                final = o
    assert final is not None
    return final


def test_stop_string_token_and_eos_are_recorded(llm):
    ref = last(llm, SamplingParams(max_tokens=30, **GREEDY))
    assert ref.finish_reason == "length" and ref.length_limit == "max_tokens" and ref.stop_reason is None
    stop = ref.text[8:11]
    out = last(llm, SamplingParams(max_tokens=30, stop=["never there", stop], **GREEDY))
    assert (out.finish_reason, out.stop_reason, out.length_limit) == ("stop", stop, None)
    assert stop_details(out, SamplingParams(stop=["never there", stop]), llm.tokenizer) == ("stop_string", stop)

    stop_tok = ref.token_ids[5]
    out = last(llm, SamplingParams(max_tokens=30, stop_token_ids=[stop_tok], **GREEDY))
    assert (out.finish_reason, out.stop_reason) == ("stop", stop_tok)
    assert stop_details(out, SamplingParams(stop=[stop]), llm.tokenizer) == ("eos", None)

    saved = llm.engine.scheduler.eos_token_ids
    llm.engine.scheduler.eos_token_ids = frozenset({ref.token_ids[3]})
    try:
        out = last(llm, SamplingParams(max_tokens=30, temperature=0))
    finally:
        llm.engine.scheduler.eos_token_ids = saved
    assert (out.finish_reason, out.stop_reason, out.token_ids) == ("stop", ref.token_ids[3], ref.token_ids[:4])


def test_the_context_limit_is_told_apart_from_max_tokens(llm):
    prompt = list(range(200, 240))  # 40 of the 48 tokens of context
    out = last(llm, SamplingParams(max_tokens=1000, **GREEDY), prompt)
    assert (out.finish_reason, out.length_limit, len(out.token_ids)) == ("length", "context", 8)
    assert stop_details(out, SamplingParams(), llm.tokenizer) == ("length", None)
    out = last(llm, SamplingParams(max_tokens=5, **GREEDY), prompt)
    assert (out.finish_reason, out.length_limit, len(out.token_ids)) == ("length", "max_tokens", 5)
