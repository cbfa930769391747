"""LLMEngine.check_request: the one validation of a request, raising a typed error that names
the field at fault, before anything is queued."""

from __future__ import annotations

import pytest

from fastmode import LLM, SamplingParams
from fastmode.engine.errors import RequestError


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return LLM(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.01, max_model_len=64, draft_model=None).engine


@pytest.mark.parametrize(
    "prompt, params, param, code, message",
    [
        ([], SamplingParams(), "prompt", None, "prompt is empty"),
        ([1, 10**9], SamplingParams(), "prompt", None, "token ids must be in"),
        ([1] * 64, SamplingParams(), "prompt", "context_length_exceeded", "context limit is 64"),
        ([1], SamplingParams(logit_bias=((10**9, 1.0),)), "logit_bias", None, "logit_bias token ids"),
        ([1], SamplingParams(speculative="draft"), "speculative", "unsupported_parameter", "needs a draft model"),
    ],
)
def test_each_rule_raises_a_typed_error_and_queues_nothing(engine, prompt, params, param, code, message):
    with pytest.raises(RequestError, match=message) as e:
        engine.check_request(prompt, params)
    assert (e.value.param, e.value.code) == (param, code)
    with pytest.raises(RequestError, match=message):
        engine.add_request(prompt, params)  # make_sequence runs the same check
    assert not engine.has_unfinished()
    assert isinstance(e.value, ValueError)  # the Python API's callers catch ValueError
