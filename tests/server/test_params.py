"""The one mapping from a request's sampling fields to SamplingParams, in every dialect: the same
fields give the same SamplingParams whichever dialect carried them, a field left out takes
SamplingParams' default, and a value the engine cannot take is a 400 naming the field."""

import pytest

from fastmode.sampling_params import SamplingParams, StructuredOutput
from fastmode.server.anthropic.models import MessagesRequest
from fastmode.server.edge.errors import ApiError
from fastmode.server.openai.models import ChatCompletionRequest, CompletionRequest
from fastmode.server.params import ApiSampling, sampling_params
from fastmode.server.responses.models import ResponseRequest

VOCAB = 100
SAMPLING = {"temperature": 0.7, "top_p": 0.9, "speculative": "ngram"}


def test_the_same_fields_give_the_same_params_in_every_dialect():
    bodies = [
        ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], **SAMPLING),
        CompletionRequest(model="m", prompt="hi", **SAMPLING),
        MessagesRequest(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}], **SAMPLING),
        ResponseRequest(model="m", input="hi", **SAMPLING),
    ]
    got = [sampling_params(b.sampling(), max_tokens=8, vocab_size=VOCAB) for b in bodies]
    assert got == [SamplingParams(temperature=0.7, top_p=0.9, speculative="ngram", max_tokens=8)] * 4


def test_fields_left_out_take_the_defaults():
    body = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}])
    assert sampling_params(body.sampling(), max_tokens=5, vocab_size=VOCAB) == SamplingParams(max_tokens=5)


def test_every_openai_field_is_mapped():
    body = ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        temperature=0.5,
        top_p=0.8,
        top_k=-1,
        seed=7,
        stop="END",
        ignore_eos=True,
        speculative="off",
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias={"12": -100, "3": 2.5},
    )
    grammar = StructuredOutput("json_object")
    got = sampling_params(body.sampling(), max_tokens=9, vocab_size=VOCAB, structured=grammar, logprobs=2)
    assert got == SamplingParams(
        temperature=0.5,
        top_p=0.8,
        top_k=0,
        seed=7,
        max_tokens=9,
        stop=("END",),
        ignore_eos=True,
        speculative="off",
        structured=grammar,
        logprobs=2,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        logit_bias=((3, 2.5), (12, -100.0)),
    )


def test_anthropic_stop_sequences_are_stop_strings():
    body = MessagesRequest(
        model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}], stop_sequences=["a", "b"], top_k=4
    )
    got = sampling_params(body.sampling(), max_tokens=8, vocab_size=VOCAB)
    assert got.stop == ("a", "b") and got.top_k == 4


@pytest.mark.parametrize(
    ("logit_bias", "words"),
    [({"abc": 1.0}, "is not a token id"), ({str(VOCAB): 1.0}, "is not a token id"), ({"5": 101.0}, "[-100, 100]")],
)
def test_a_bad_logit_bias_is_a_400_naming_it(logit_bias, words):
    with pytest.raises(ApiError) as e:
        sampling_params(ApiSampling(logit_bias=logit_bias), max_tokens=8, vocab_size=VOCAB)
    assert e.value.status("openai") == 400 and e.value.param == "logit_bias" and words in e.value.message


def test_a_value_samplingparams_refuses_is_a_400():
    with pytest.raises(ApiError) as e:
        sampling_params(ApiSampling(), max_tokens=0, vocab_size=VOCAB)
    assert e.value.status("openai") == 400 and "max_tokens" in e.value.message
