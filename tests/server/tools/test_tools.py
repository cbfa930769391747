"""The server's tool modules on their own: the grammars (checked with llguidance, not with a model),
the prompt rendering (fallback and a template that renders tools), and the parser."""

from __future__ import annotations

import json

import pytest
from llguidance import LLMatcher, LLTokenizer
from tokenizers import Tokenizer as HFTokenizer

from fastmode.loader.tokenizer import Tokenizer
from fastmode.sampling_params import StructuredOutput
from fastmode.server.tools.call_format import format_call
from fastmode.server.tools.call_parser import ArgumentsDelta, CallEnd, CallStart, TextDelta, ToolCallParser
from fastmode.server.tools.grammar import MAX_CALLS_PER_TURN, tool_grammar
from fastmode.server.tools.prompt import fallback_messages, render_prompt, render_text, renders_tools
from fastmode.server.tools.specs import ToolChoice, ToolError, ToolSpec
from tests.builders import CHATML, build_tokenizer

WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Berlin"]}, "days": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["city"],
        "additionalProperties": False,
    },
    strict=True,
)
NOOP = ToolSpec("noop", "Does nothing")  # the default schema: an object with any properties

CALL_W = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}</tool_call>'
CALL_N = '<tool_call>{"name": "noop", "arguments": {}}</tool_call>'


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Tokenizer:
    path = tmp_path_factory.mktemp("tok")
    build_tokenizer(path)
    return Tokenizer(
        HFTokenizer.from_file(str(path / "tokenizer.json")),
        bos_token_id=None,
        eos_token_ids=[2],
        add_bos=False,
        chat_template=CHATML,
    )


@pytest.fixture(scope="module")
def ll_tok(tok) -> LLTokenizer:
    return LLTokenizer(tok.backend.to_str(), eos_token=2)


def accepts(ll_tok: LLTokenizer, grammar: str, text: str) -> bool:
    """Whether `text`, tokenized, is a complete output under the Lark `grammar`."""
    m = LLMatcher(ll_tok, LLMatcher.grammar_from_lark(grammar), log_level=0)
    assert not m.is_error(), m.get_error()
    return m.consume_tokens(ll_tok.tokenize_str(text)) and m.is_accepting()


def grammar(tools, choice, answer=None) -> str:
    g = tool_grammar(tools, choice, answer)
    assert g is not None and g.kind == "lark"
    return g.spec


def test_auto_accepts_text_or_calls_and_refuses_malformed_calls(ll_tok):
    g = grammar([WEATHER, NOOP], ToolChoice("auto"))
    for ok in [
        "",
        "Sunny, I think.",
        "a < b and <tool_cal",
        "I'll check.\n" + CALL_W,
        CALL_W + "\n" + CALL_N,
        '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>',
    ]:
        assert accepts(ll_tok, g, ok), ok
    for bad in [
        "text <tool_call> and no call",
        '<tool_call>{"name": "search", "arguments": {}}</tool_call>',  # not an offered tool
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',  # not in the enum
        '<tool_call>{"name": "get_weather", "arguments": {"days": 3}}</tool_call>',  # city is required
        '<tool_call>{"name": "get_weather", "arguments": {"city":"Paris"}}</tool_call>',  # not the canonical layout
        CALL_W + " and then text",  # nothing follows the calls
        '<tool_call>{"name": "noop", "arguments": {}}',  # unfinished
    ]:
        assert not accepts(ll_tok, g, bad), bad


def test_required_named_and_single_call(ll_tok):
    required = grammar([WEATHER, NOOP], ToolChoice("required"))
    assert accepts(ll_tok, required, CALL_N) and accepts(ll_tok, required, CALL_W + "\n" + CALL_N)
    assert not accepts(ll_tok, required, "") and not accepts(ll_tok, required, "Sure. " + CALL_N)
    named = grammar([WEATHER, NOOP], ToolChoice("named", "noop"))
    assert accepts(ll_tok, named, CALL_N) and not accepts(ll_tok, named, CALL_W)
    assert not accepts(ll_tok, named, CALL_N + "\n" + CALL_N)  # a named choice is exactly one call
    bound = MAX_CALLS_PER_TURN  # parallel calls stop at the bound: a repeating model cannot run to max_tokens
    assert accepts(ll_tok, required, "\n".join([CALL_N] * bound))
    assert not accepts(ll_tok, required, "\n".join([CALL_N] * (bound + 1)))
    single = grammar([WEATHER, NOOP], ToolChoice("required", parallel=False))
    assert accepts(ll_tok, single, CALL_W) and not accepts(ll_tok, single, CALL_W + "\n" + CALL_N)
    none = grammar([WEATHER], ToolChoice("none"))
    assert accepts(ll_tok, none, "just text") and not accepts(ll_tok, none, CALL_W)


def test_auto_with_an_answer_format_is_calls_or_one_json_answer(ll_tok):
    answer = StructuredOutput(
        "json_schema",
        json.dumps(
            {
                "type": "object",
                "properties": {"ok": {"type": "boolean"}},
                "required": ["ok"],
                "additionalProperties": False,
            }
        ),
    )
    g = grammar([WEATHER, NOOP], ToolChoice("auto"), answer)
    assert accepts(ll_tok, g, '{"ok": true}') and accepts(ll_tok, g, CALL_N)
    for bad in ["plain text", '{"ok":true}', '{"ok": true}' + CALL_N, "Sure. " + CALL_N]:
        assert not accepts(ll_tok, g, bad), bad
    assert tool_grammar([WEATHER], ToolChoice("none"), answer) is answer
    assert tool_grammar([], ToolChoice("auto"), answer) is answer
    forced = grammar([WEATHER, NOOP], ToolChoice("required"), answer)
    assert accepts(ll_tok, forced, CALL_N) and not accepts(ll_tok, forced, '{"ok": true}')
    with pytest.raises(ToolError, match="cannot be combined with tools"):
        tool_grammar([WEATHER], ToolChoice("auto"), StructuredOutput("regex", "a+"))


def test_grammar_errors_name_the_tool():
    assert tool_grammar([], ToolChoice("auto")) is None
    with pytest.raises(ToolError, match="needs at least one tool"):
        tool_grammar([], ToolChoice("required"))
    with pytest.raises(ToolError, match="'other', which is not in `tools`"):
        tool_grammar([WEATHER], ToolChoice("named", "other"))
    with pytest.raises(ToolError, match=r"tools\[1\]: two tools are named 'noop'"):
        tool_grammar([NOOP, NOOP], ToolChoice("auto"))
    with pytest.raises(ToolError, match="tool names are"):
        tool_grammar([ToolSpec("bad name")], ToolChoice("auto"))
    bad_schema = ToolSpec("f", parameters={"type": "object", "properties": {"x": {"type": "strng"}}}, strict=True)
    with pytest.raises(ToolError, match=r"tools\[0\] \(f\): the parameters schema is not usable"):
        tool_grammar([bad_schema], ToolChoice("auto"))
    with pytest.raises(ToolError, match="must describe a JSON object"):
        tool_grammar([ToolSpec("f", parameters={"type": "string"})], ToolChoice("auto"))


def test_parser_streams_text_then_calls_in_any_chunking():
    out = "Let me look. " + CALL_W + "\n" + CALL_N
    for size in (1, 2, 5, 7, len(out)):
        p = ToolCallParser("call_")
        events = [e for i in range(0, len(out), size) for e in p.feed(out[i : i + size])] + p.finish()
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        starts = [e for e in events if isinstance(e, CallStart)]
        ends = [e for e in events if isinstance(e, CallEnd)]
        assert text == "Let me look. " == p.text
        assert [(s.index, s.name) for s in starts] == [(0, "get_weather"), (1, "noop")]
        assert all(s.id.startswith("call_") and len(s.id) == 29 for s in starts)
        for e in ends:
            fragments = "".join(a.fragment for a in events if isinstance(a, ArgumentsDelta) and a.index == e.index)
            assert fragments == e.arguments_json
        assert [json.loads(e.arguments_json) for e in ends] == [{"city": "Paris", "days": 3}, {}]
        assert [(c.name, c.arguments) for c in p.calls] == [("get_weather", {"city": "Paris", "days": 3}), ("noop", {})]
        assert not p.open_call
        # Events come in order: a call's start before its arguments, its arguments before its end.
        kinds = [type(e).__name__ for e in events if not isinstance(e, TextDelta)]
        assert kinds[0] == "CallStart" and kinds.index("CallEnd") < len(kinds) - 1


def test_parser_handles_strings_with_braces_and_newline_layout():
    args = {"q": 'a "}" {[ \\ x', "n": [1, {"k": "}"}]}
    out = f'<tool_call>\n{{"name": "f", "arguments": {json.dumps(args)}}}\n</tool_call>'
    p = ToolCallParser("toolu_")
    events = [e for ch in out for e in p.feed(ch)] + p.finish()
    assert [c.arguments for c in p.calls] == [args] and p.text == ""
    assert isinstance(events[0], CallStart) and events[0].id.startswith("toolu_")


def test_parser_text_only_and_cut_off_call():
    p = ToolCallParser()
    assert p.feed("x <tool") == [TextDelta("x ")]  # "<tool" may open a call: held back
    assert p.feed("box> y") == [TextDelta("<toolbox> y")]
    assert p.feed(" <tool_ca") == [TextDelta(" ")]
    assert p.finish() == [TextDelta("<tool_ca")]
    cut = ToolCallParser()
    cut.feed('<tool_call>{"name": "noop", "arguments": {"a": ')
    assert cut.open_call and cut.calls == [] and cut.finish() == []


def test_parser_passes_unconstrained_strays_on_as_text():
    p = ToolCallParser()
    events = p.feed("<tool_call>not json</tool_call> ok") + p.finish()
    assert not any(isinstance(e, CallStart) for e in events)
    assert p.text == "<tool_call>not json</tool_call> ok"


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": {}}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "done"},
]


def test_fallback_rendering(tok):
    msgs = fallback_messages(HISTORY, [WEATHER, NOOP])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools") and '"name": "get_weather"' in msgs[0]["content"]
    assert msgs[2]["content"] == (format_call("get_weather", {"city": "Paris"}) + "\n" + format_call("noop", {}))
    assert msgs[3]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\ndone\n</tool_response>"
    assert not renders_tools(tok)
    text = render_text(tok, HISTORY, [WEATHER])
    assert text.endswith("<|im_start|>assistant\n") and "<tool_call>" in text
    assert render_prompt(tok, HISTORY, [WEATHER]) == tok.encode(text, add_special_tokens=False)
    # Without tools the history still renders (calls and results in the same layout), with no tools section.
    assert "# Tools" not in render_text(tok, HISTORY, [])


HERMES = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>"
    "Use <tool_call></tool_call>.<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "\n</tool_call>{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_template_that_renders_tools_is_used(tok):
    native = Tokenizer(tok.backend, bos_token_id=None, eos_token_ids=[2], add_bos=False, chat_template=HERMES)
    assert renders_tools(native)
    text = render_text(native, HISTORY, [WEATHER])
    assert text.startswith('<|im_start|>system\n<tools>{"type": "function"') and "# Tools" not in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
