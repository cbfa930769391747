"""The one text layout every tool call takes, whatever the dialect.

Every call the model writes has one canonical layout,

    <tool_call>{"name": "NAME", "arguments": ARGS}</tool_call>

(a newline is allowed just inside the tags, as Hermes-style templates write
them; several calls are separated by one newline). The grammar from
`tool_grammar` lets NAME be only an offered tool and ARGS only a JSON object
valid under that tool's schema, written as `json.dumps` writes it (", " and
": " separators, no other whitespace), so `ToolCallParser` reads calls with a
deterministic scan of that layout, never by guessing over free text.
"""

from __future__ import annotations

import json
import re

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
RESPONSE_OPEN = "<tool_response>"
RESPONSE_CLOSE = "</tool_response>"
CALL_SEPARATOR = "\n"  # between two calls of one turn
NAME_PREFIX = '{"name": "'
ARGS_PREFIX = '", "arguments": '
CALL_END = "}"  # closes the call object; CALL_CLOSE follows
# The arguments' layout: json.dumps's separators, no other whitespace. A fixed
# layout keeps the model from padding with whitespace forever, and makes the
# arguments streamed to the client the same text the client is shown in history.
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# OpenAI's and Anthropic's rule for tool names; it also keeps names free of
# characters that would need escaping in JSON or in the grammar.
NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
NAME_PREFIX_RE = re.compile(r"[A-Za-z0-9_.-]{0,128}")


def format_call(name: str, arguments: dict | str) -> str:
    """One call in the canonical layout, as the grammar makes the model write it."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return f"{CALL_OPEN}{NAME_PREFIX}{name}{ARGS_PREFIX}{args}{CALL_END}{CALL_CLOSE}"
