"""The output items of a Responses turn and the stream events that build them.

`OutputBuilder` turns what the model writes (reasoning, text, tool calls and
their argument fragments) into `reasoning`, `message` and `function_call`
items and emits the events OpenAI streams for them, in OpenAI's order:

    reasoning:     response.output_item.added, response.content_part.added,
                   response.reasoning_text.delta*, response.reasoning_text.done,
                   response.content_part.done, response.output_item.done
    message:       response.output_item.added, response.content_part.added,
                   response.output_text.delta*, response.output_text.done,
                   response.content_part.done, response.output_item.done
    function_call: response.output_item.added,
                   response.function_call_arguments.delta*,
                   response.function_call_arguments.done, response.output_item.done

A reasoning item holds the think block as one `reasoning_text` part and an
empty `summary` (no summaries are written); it comes first, and closes when
the answer (or a call) opens.

Both transports (HTTP server-sent events and the WebSocket mode) send these
same events; they add only the framing.
"""

from __future__ import annotations

import uuid


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    """The items of one response as they grow. Every method returns the events to send, in order."""

    def __init__(self):
        self.output: list[dict] = []
        self._message: dict | None = None  # the message item being written
        self._message_text = ""
        self._message_logprobs: list[dict] = []
        self._pending_logprobs: list[dict] = []  # of tokens whose text is not out yet (a split UTF-8 character)
        self._calls: dict[int, dict] = {}  # parser call index -> its function_call item, while open
        self._reasoning: dict | None = None  # the reasoning item being written
        self._reasoning_text = ""

    def _where(self, item: dict) -> dict:
        index = next(i for i, it in enumerate(self.output) if it is item)
        return {"item_id": item["id"], "output_index": index}

    def reasoning(self, delta: str) -> list[dict]:
        """Reasoning the model wrote, in the reasoning item (opened for it if none is open)."""
        if not delta:
            return []
        events = []
        if self._reasoning is None:
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress", "summary": [], "content": []}
            self._reasoning, self._reasoning_text = item, ""
            self.output.append(item)
            events += [
                {"type": "response.output_item.added", "output_index": len(self.output) - 1, "item": dict(item)},
                {
                    "type": "response.content_part.added",
                    **self._where(item),
                    "content_index": 0,
                    "part": {"type": "reasoning_text", "text": ""},
                },
            ]
        self._reasoning_text += delta
        events.append(
            {
                "type": "response.reasoning_text.delta",
                **self._where(self._reasoning),
                "content_index": 0,
                "delta": delta,
            }
        )
        return events

    def close_reasoning(self, status: str = "completed") -> list[dict]:
        item = self._reasoning
        if item is None:
            return []
        self._reasoning = None
        part = {"type": "reasoning_text", "text": self._reasoning_text}
        item.update(status=status, content=[part])
        where = self._where(item)
        return [
            {"type": "response.reasoning_text.done", **where, "content_index": 0, "text": part["text"]},
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": item},
        ]

    def open_message(self) -> list[dict]:
        if self._message is not None:
            return []
        events = self.close_reasoning()  # the answer follows the reasoning
        item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
        self._message, self._message_text, self._message_logprobs = item, "", []
        self.output.append(item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return events + [
            {"type": "response.output_item.added", "output_index": len(self.output) - 1, "item": dict(item)},
            {"type": "response.content_part.added", **self._where(item), "content_index": 0, "part": part},
        ]

    def text(self, delta: str, logprobs: list[dict] | None = None) -> list[dict]:
        """Text the model wrote (opening a message item if none is open), with its tokens' logprobs."""
        self._pending_logprobs += logprobs or ()
        if not delta:
            return []
        events = self.open_message()
        item = self._message
        self._message_text += delta
        self._message_logprobs += self._pending_logprobs
        events.append(
            {
                "type": "response.output_text.delta",
                **self._where(item),
                "content_index": 0,
                "delta": delta,
                "logprobs": self._pending_logprobs,
            }
        )
        self._pending_logprobs = []
        return events

    def close_message(self, status: str = "completed") -> list[dict]:
        item = self._message
        if item is None:
            return []
        self._message = None
        text, logprobs = self._message_text, self._message_logprobs + self._pending_logprobs
        self._pending_logprobs = []
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
        item.update(status=status, content=[part])
        where = self._where(item)
        return [
            {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": logprobs},
            {"type": "response.content_part.done", **where, "content_index": 0, "part": part},
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": item},
        ]

    def call_start(self, index: int, call_id: str, name: str) -> list[dict]:
        events = self.close_reasoning() + self.close_message()  # text before a call is its own message item
        self._pending_logprobs = []  # tokens that wrote the call's opening, not text
        item = {
            "id": new_id("fc"),
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        self._calls[index] = item
        self.output.append(item)
        events.append({"type": "response.output_item.added", "output_index": len(self.output) - 1, "item": dict(item)})
        return events

    def call_arguments(self, index: int, fragment: str) -> list[dict]:
        item = self._calls[index]
        item["arguments"] += fragment
        return [{"type": "response.function_call_arguments.delta", **self._where(item), "delta": fragment}]

    def call_end(self, index: int, arguments: str, status: str = "completed") -> list[dict]:
        item = self._calls.pop(index)
        item.update(arguments=arguments, status=status)
        where = self._where(item)
        return [
            {"type": "response.function_call_arguments.done", **where, "name": item["name"], "arguments": arguments},
            {"type": "response.output_item.done", "output_index": where["output_index"], "item": item},
        ]

    def finish(self, status: str) -> list[dict]:
        """Close every open item with `status` (incomplete when the output budget cut them)."""
        events = self.close_reasoning(status) + self.close_message(status)
        for index in list(self._calls):
            events += self.call_end(index, self._calls[index]["arguments"], status)
        return events

    @property
    def text_so_far(self) -> str:
        return "".join(p["text"] for it in self.output if it["type"] == "message" for p in it["content"])

    @property
    def reasoning_so_far(self) -> str:
        return "".join(p["text"] for it in self.output if it["type"] == "reasoning" for p in it["content"])

    @property
    def calls(self) -> list[dict]:
        return [it for it in self.output if it["type"] == "function_call"]
