"""Structured outputs: llguidance grammars enforced token by token on the embedded model."""

from __future__ import annotations

import json
import re

import pytest
import torch

from fastmode import SamplingParams
from fastmode.engine.scheduler import ScheduledSeq
from fastmode.engine.sequence import Sequence
from fastmode.engine.structured import (
    StructuredOutputError,
    apply_mask,
    compile_structured,
    fill_masks,
)
from fastmode.sampling_params import StructuredOutput

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def llm(default_llm):
    return default_llm


def chat(llm, text: str) -> list[int]:
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def greedy(structured: StructuredOutput | None, max_tokens: int = 64, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, structured=structured, **kw)


def test_json_schema_output_parses_and_follows_the_schema(llm):
    so = StructuredOutput("json_schema", json.dumps(PERSON))
    out = llm.generate(chat(llm, "Describe Bob, 42, as JSON."), greedy(so, 80))[0]
    assert out.finish_reason == "stop" and out.token_ids[-1] in llm.tokenizer.eos_token_ids
    obj = json.loads(out.text)
    assert set(obj) == {"name", "age", "tags"}
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 20
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 150
    assert isinstance(obj["tags"], list) and len(obj["tags"]) <= 3 and all(isinstance(t, str) for t in obj["tags"])
    try:
        import jsonschema
    except ImportError:
        return
    jsonschema.validate(obj, PERSON)


def test_json_object_is_any_object(llm):
    out = llm.generate(chat(llm, "Say hi."), greedy(StructuredOutput("json_object"), 200))[0]
    if out.finish_reason == "stop":
        assert isinstance(json.loads(out.text), dict)
    else:  # cut by max_tokens: still the start of an object
        assert out.text.startswith("{")


def test_regex_output_matches_the_pattern(llm):
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    out = llm.generate(chat(llm, "Write a code."), greedy(StructuredOutput("regex", pattern)))[0]
    assert out.finish_reason == "stop"
    assert re.fullmatch(pattern, out.text), out.text


def test_lark_grammar_with_embedded_json(llm):
    grammar = 'start: "Answer: " ("yes" | "no") "\\n" obj\nobj: %json {"type": "object", "properties": {"why": {"type": "string", "maxLength": 30}}, "required": ["why"], "additionalProperties": false}\n'
    out = llm.generate(chat(llm, "Is the sky blue? Explain."), greedy(StructuredOutput("lark", grammar), 60))[0]
    assert out.finish_reason == "stop"
    head, body = out.text.split("\n", 1)
    assert head in ("Answer: yes", "Answer: no")
    assert set(json.loads(body)) == {"why"}


def test_constrained_and_free_rows_share_a_batch_without_changing_each_other(llm):
    so = StructuredOutput("json_schema", json.dumps(PERSON))
    free_prompt, json_prompt = chat(llm, "Tell me about cats."), chat(llm, "Describe Ann, 30, as JSON.")
    free_p, json_p = greedy(None, 40, ignore_eos=True), greedy(so, 60)
    solo_free = llm.generate(free_prompt, free_p)[0]
    solo_json = llm.generate(json_prompt, json_p)[0]
    both = llm.generate([free_prompt, json_prompt, free_prompt], [free_p, json_p, free_p])
    assert both[0].token_ids == solo_free.token_ids and both[2].token_ids == solo_free.token_ids
    assert both[1].token_ids == solo_json.token_ids
    json.loads(both[1].text)


def test_checking_the_argmax_gives_the_same_tokens_as_the_full_mask(llm, monkeypatch):
    """Greedy rows without logprobs skip the full mask while the grammar allows their argmax;
    requesting logprobs (or forcing the full mask) must give the very same tokens, and the
    refused argmaxes must really have occurred (the check is exercised, not bypassed)."""
    from fastmode.engine.model_runner import ModelRunner

    so = StructuredOutput("json_schema", json.dumps(PERSON))
    prompts = [chat(llm, "Describe Bob, 42, as JSON."), chat(llm, "Tell me a story about a dragon.")]
    checked = [llm.generate(p, greedy(so, 60))[0] for p in prompts]
    with_logprobs = [llm.generate(p, greedy(so, 60, logprobs=0))[0] for p in prompts]
    assert [o.token_ids for o in checked] == [o.token_ids for o in with_logprobs]

    refused = []
    original = ModelRunner._mask_job

    def counting(self, constrained, parallel=True):
        refused.append(len(constrained))
        return original(self, constrained, parallel)

    monkeypatch.setattr(ModelRunner, "_mask_job", counting)
    again = llm.generate(prompts[1], greedy(so, 60))[0]
    assert again.token_ids == checked[1].token_ids
    assert refused, "the story prompt's free argmax never broke the schema"
    monkeypatch.setattr(ModelRunner, "_needs_full_mask", staticmethod(lambda s, k: s.seq.grammar is not None))
    full = llm.generate(prompts[1], greedy(so, 60))[0]
    assert full.token_ids == checked[1].token_ids


def test_speculation_on_and_off_give_identical_constrained_output(llm, drafting_always):
    drafting_always(llm)
    # A repetitive prompt and an array of repeated strings: n-gram drafts get proposed, and
    # many are accepted; drafts the grammar forbids must be rejected.
    schema = {"type": "array", "items": {"type": "string", "maxLength": 12}, "minItems": 8, "maxItems": 8}
    so = StructuredOutput("json_schema", json.dumps(schema))
    prompt = chat(
        llm, "Repeat the word apple eight times as a JSON list: apple apple apple apple apple apple apple apple"
    )
    stats = llm.engine.spec.stats
    before = sum(stats.draft_tokens.values())
    off = llm.generate(prompt, greedy(so, 80, speculative="off"))[0]
    on = llm.generate(prompt, greedy(so, 80, speculative="ngram"))[0]
    assert on.token_ids == off.token_ids
    assert len(json.loads(on.text)) == 8
    assert sum(stats.draft_tokens.values()) > before  # speculation really ran


def test_invalid_specs_raise_before_anything_is_queued(llm):
    engine = llm.engine
    bad = [
        StructuredOutput("json_schema", '{"type": "objec"}'),
        StructuredOutput("json_schema", '{"type": '),
        StructuredOutput("json_schema", ""),
        StructuredOutput("json_schema", "true"),
        StructuredOutput("json_schema", '{"type": "string", "format": "no-such-format"}'),
        StructuredOutput("regex", "a(b"),
        StructuredOutput("lark", "start: foo"),
    ]
    for so in bad:
        with pytest.raises(StructuredOutputError) as err:
            engine.add_request([1, 2, 3], greedy(so))
        msg = str(err.value)
        assert "\n" not in msg and len(msg) < 300, msg
        assert isinstance(err.value, ValueError)
        assert not engine.has_unfinished()
    with pytest.raises(StructuredOutputError, match="regex"):
        compile_structured(StructuredOutput("regex", "a(b"), llm.tokenizer)


def test_compiled_grammars_are_cached_per_spec(llm):
    so = StructuredOutput("regex", "[ab]+")
    assert compile_structured(so, llm.tokenizer) is compile_structured(
        StructuredOutput("regex", "[ab]+"), llm.tokenizer
    )
    assert compile_structured(so, llm.tokenizer) is not compile_structured(
        StructuredOutput("regex", "[ab]*"), llm.tokenizer
    )


def allowed_by(bitmask: torch.Tensor, vocab_size: int, eos_token_id: int | None) -> torch.Tensor:
    """(rows, vocab_size) bool: the tokens whose logits `apply_mask` leaves finite."""
    logits = torch.zeros(bitmask.shape[0], vocab_size)
    apply_mask(logits, bitmask, eos_token_id)
    return torch.isfinite(logits)


def _runner_decode(llm, seq: Sequence, rigged: torch.Tensor, max_steps: int = 40) -> list[int]:
    """Decode through the engine's runner, one token a step, from fixed logits `rigged` (V,)."""
    runner = llm.engine.runner
    eos = llm.tokenizer.eos_token_ids
    try:
        for _ in range(max_steps):
            tok = runner._sample(rigged.clone().unsqueeze(0), [(ScheduledSeq(seq, 1), 1)])[seq.request_id][0]
            seq.token_ids.append(tok)
            if tok in eos:
                break
    finally:
        runner.release(seq.request_id)
    return seq.output_token_ids


def test_grammar_forbids_eos_until_the_json_is_complete(llm):
    tok = llm.tokenizer
    vocab = llm.engine.loaded.config.vocab_size
    (eos,) = tok.eos_token_ids
    rigged = torch.zeros(vocab)
    rigged[eos] = 50.0  # the model "wants" to stop at once, then to close, then to open
    rigged[tok.encode("}", add_special_tokens=False)[0]] = 40.0
    rigged[tok.encode("{", add_special_tokens=False)[0]] = 30.0
    seq = Sequence("eos-test", [1, 2], greedy(StructuredOutput("json_object")))
    seq.grammar = compile_structured(seq.params.structured, tok)
    out = _runner_decode(llm, seq, rigged)
    assert out[-1] == eos and eos not in out[:-1]
    assert tok.decode(out[:-1]) == "{}"

    # Once the value is complete, EOS is the only token allowed.
    m = seq.grammar.matcher()
    assert m.consume_tokens(tok.encode('{"a": 1}', add_special_tokens=False))
    allowed = allowed_by(fill_masks([(m, 0, [])], 1, seq.grammar.mask_words), vocab, eos)[0]
    assert allowed.nonzero().flatten().tolist() == [eos]
    m = seq.grammar.matcher()
    assert m.consume_tokens(tok.encode('{"a": 1', add_special_tokens=False))
    allowed = allowed_by(fill_masks([(m, 0, [])], 1, seq.grammar.mask_words), vocab, eos)[0]
    assert not allowed[eos] and allowed.sum() > 1


def test_ids_past_the_tokenizer_are_never_allowed(llm):
    g = compile_structured(StructuredOutput("regex", ".*"), llm.tokenizer)
    vocab = llm.tokenizer.vocab_size
    allowed = allowed_by(fill_masks([(g.matcher(), 0, [])], 1, g.mask_words), vocab + 100, g.eos_token_id)[0]
    assert allowed.shape == (vocab + 100,)
    assert allowed[:vocab].any() and not allowed[vocab:].any()


def test_a_draft_the_grammar_forbids_is_rejected(llm):
    tok = llm.tokenizer
    vocab = llm.engine.loaded.config.vocab_size
    letter = tok.encode("x", add_special_tokens=False)[0]
    digit = tok.encode("7", add_special_tokens=False)[0]
    rows = torch.zeros(2, vocab)
    rows[:, letter] = 20.0  # the target agrees with the draft "x" ...
    rows[:, digit] = 10.0
    runner = llm.engine.runner

    def verify(structured):
        seq = Sequence(f"draft-{structured is not None}", [1, 2], greedy(structured))
        if structured is not None:
            seq.grammar = compile_structured(structured, tok)
        seq.draft_token_ids = [letter]
        try:
            return runner._sample(rows.clone(), [(ScheduledSeq(seq, 2, 1), 2)])[seq.request_id]
        finally:
            runner.release(seq.request_id)

    assert verify(None) == [letter, letter]  # unconstrained: the draft is accepted
    assert verify(StructuredOutput("regex", "[0-9]+")) == [digit]  # ... but the grammar forbids it


def test_bitmask_layout_and_the_eos_fallback():
    bitmask = torch.tensor([[0b101, 1 << 3], [0, 0]], dtype=torch.int32)  # row 1: a matcher allowing nothing
    allowed = allowed_by(bitmask, 70, eos_token_id=33)
    assert allowed[0].nonzero().flatten().tolist() == [0, 2, 35]  # bit k of word w is token 32w + k
    assert allowed[1].nonzero().flatten().tolist() == [33]  # nothing allowed: EOS ends the request
    assert bitmask[1].tolist() == [0, 0]  # the caller's masks are left as they were
    assert allowed_by(bitmask, 36, None)[0].nonzero().flatten().tolist() == [0, 2, 35]
