"""How tools reach the prompt.

Chat messages here follow Hugging Face's convention, whatever the dialect:

    {"role": "assistant", "content": str | None,
     "tool_calls": [{"id", "type": "function", "function": {"name", "arguments": dict}}]}
    {"role": "tool", "tool_call_id": str, "name": str (optional), "content": str}

A checkpoint whose chat template renders `tools` in the `<tool_call>` format
(`tool_call_format`) gets its own template. Any other template (the embedded
SmolLM2's renders no tools) gets the fallback: the tools, as JSON schemas, and
the call format described in the system prompt; assistant turns with calls
written in the canonical layout; tool results sent back as a user turn of
`<tool_response>...</tool_response>` blocks, one per result.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastmode.loader.tokenizer import Tokenizer
from fastmode.server.tools.call_format import CALL_OPEN, CALL_SEPARATOR, RESPONSE_CLOSE, RESPONSE_OPEN, format_call
from fastmode.server.tools.specs import ToolSpec

Message = dict[str, Any]


def _tools_section(tools: Sequence[ToolSpec]) -> str:
    listed = "\n".join(
        json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}, ensure_ascii=False)
        for t in tools
    )
    example = format_call("function_name", {"argument": "value"})
    return (
        "# Tools\n\n"
        "You can call functions to answer. Each function is described by one JSON object (its name, what it does, "
        "and a JSON schema of its arguments) inside <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "To call a function, write its name and arguments as a JSON object inside <tool_call></tool_call>, "
        f"one call per line and nothing after the last call:\n{example}\n"
        f"The result of each call comes back inside {RESPONSE_OPEN}{RESPONSE_CLOSE}."
    )


def fallback_messages(messages: Sequence[Message], tools: Sequence[ToolSpec]) -> list[Message]:
    """`messages` rewritten for a template that knows only role and text content (see the module doc)."""
    out: list[Message] = []
    results_open = False  # the last message is a user turn of tool results: further results join it
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            block = f"{RESPONSE_OPEN}\n{content}\n{RESPONSE_CLOSE}"
            if results_open:
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + block}
            else:
                out.append({"role": "user", "content": block})
            results_open = True
            continue
        results_open = False
        if role == "assistant" and m.get("tool_calls"):
            calls = CALL_SEPARATOR.join(
                format_call(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
            )
            content = f"{content}{calls}" if content else calls
        out.append({"role": role, "content": content})
    if tools:
        section = _tools_section(tools)
        if out and out[0]["role"] == "system":
            out[0] = {
                "role": "system",
                "content": f"{out[0]['content']}\n\n{section}" if out[0]["content"] else section,
            }
        else:
            out.insert(0, {"role": "system", "content": section})
    return out


_PROBE_TOOL = ToolSpec("fastmode_probe_tool", "probe")
_native_by_template: dict[str, bool] = {}


def renders_tools(tok: Tokenizer) -> bool:
    """Whether the checkpoint's template renders `tools` itself, in the `<tool_call>` format the grammar enforces."""
    template = tok.chat_template
    if not template or CALL_OPEN not in template:
        return False
    if template not in _native_by_template:
        try:
            text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL.as_hf()])
            _native_by_template[template] = _PROBE_TOOL.name in text
        except Exception:  # a template that fails on `tools` does not render them  # noqa: BLE001
            _native_by_template[template] = False
    return _native_by_template[template]


def render_text(
    tok: Tokenizer, messages: Sequence[Message], tools: Sequence[ToolSpec] = (), add_generation_prompt: bool = True
) -> str:
    """The prompt text for a conversation with tools (either way of rendering)."""
    if renders_tools(tok):
        return tok.apply_chat_template(messages, add_generation_prompt, tools=[t.as_hf() for t in tools] or None)
    return tok.apply_chat_template(fallback_messages(messages, tools), add_generation_prompt)


def render_prompt(tok: Tokenizer, messages: Sequence[Message], tools: Sequence[ToolSpec] = ()) -> list[int]:
    """Prompt token ids for a conversation with tools. ValueError if the template refuses it."""
    # The template writes any BOS itself, so no special tokens are added on top.
    return tok.encode(render_text(tok, messages, tools), add_special_tokens=False)
