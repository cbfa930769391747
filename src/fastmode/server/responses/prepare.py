"""Checking and admitting one Responses turn, before any of its events is sent.

`prepare_turn` refuses everything that can be refused (a bad schema, an
unknown previous_response_id, a thinking switch the model lacks, a full fast
lane) and builds the prompt: the conversation continued from the previous
turn's tokens where the template allows (conversation.py), rendered with the
request's thinking switch (`reasoning.effort`, see reasoning.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass

from fastmode.sampling_params import StructuredOutput
from fastmode.server.edge.errors import ApiError, clip
from fastmode.server.generation import Job, check_structured, resolve_max_tokens
from fastmode.server.openai.api import tier_choice
from fastmode.server.params import sampling_params
from fastmode.server.reasoning import is_thinking_model, prompt_opens_thinking, with_thinking
from fastmode.server.responses.conversation import Message, Turn, build_prompt
from fastmode.server.responses.events import new_id
from fastmode.server.responses.models import ResponseRequest
from fastmode.server.state import ServerState
from fastmode.server.tools.grammar import tool_grammar
from fastmode.server.tools.prompt import render_text
from fastmode.server.tools.specs import ToolChoice, ToolError, ToolSpec

Lookup = Callable[[str], "Turn | None"]


@dataclass
class PreparedTurn:
    job: Job
    body: ResponseRequest
    response_id: str
    history: list[Message]  # the conversation so far, without the system message
    generate: bool
    tools_key: str
    calls_possible: bool  # tools are offered and tool_choice is not none: the output is parsed for calls
    # A thinking model's output: None = no think blocks; else whether the prompt opened one.
    reasoning_from_prompt: bool | None = None


def _previous(body: ResponseRequest, lookup: Lookup) -> Turn | None:
    if body.previous_response_id is None:
        return None
    prev = lookup(body.previous_response_id)
    if prev is None:
        raise ApiError(
            "invalid_request",
            f"Previous response with id '{clip(body.previous_response_id)}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return prev


def _grammar(tools: list[ToolSpec], choice: ToolChoice, answer: StructuredOutput | None) -> StructuredOutput | None:
    """The turn's grammar: calls as `tool_choice` allows, and a reply without calls under `text.format`."""
    try:
        return tool_grammar(tools, choice, answer)
    except ToolError as e:
        param = "text.format" if e.param == "response_format" else e.param
        raise ApiError("invalid_request", str(e).replace("response_format", "text.format"), param=param) from e


async def prepare_turn(
    state: ServerState, body: ResponseRequest, lookup: Lookup, generate: bool = True
) -> PreparedTurn:
    """Validate, build the prompt and admit; raises ApiError (nothing is left behind)."""
    state.check_input(body)
    model = state.select(body.model)
    body.unsupported()
    effort = body.reasoning.effort if body.reasoning is not None else None
    if effort is not None and not model.tokenizer.has_thinking_switch:
        raise ApiError(
            "invalid_request",
            f"reasoning.effort: {model.name}'s chat template has no thinking switch; remove it",
            param="reasoning.effort",
            code="unsupported_parameter",
        )
    tools = body.tool_specs()
    choice = body.choice()
    prev = _previous(body, lookup)
    history = prev.messages if prev else []
    new = body.new_messages(history)
    answer = body.structured()
    structured = _grammar(tools, choice, answer)
    # A grammar that fixes the output from its first token (a JSON answer, forced calls) leaves
    # no room for a think block: thinking is switched off for such a turn, as in chat.
    forced = answer is not None or (bool(tools) and choice.mode in ("required", "named"))
    thinking = False if forced else body.thinking()
    tok = with_thinking(model.tokenizer, thinking)
    if generate:  # the format alone first, so that a bad schema is named as such
        await check_structured(model, answer, "text.format")
        await check_structured(model, structured, "text.format" if structured is answer else "tools")
    # Tools and the thinking switch are part of the prompt: a turn that changes either cannot
    # extend the previous one's tokens.
    tools_key = json.dumps([t.as_hf() for t in tools], sort_keys=True) if tools else ""
    if thinking is not None and tok.has_thinking_switch:
        tools_key += f"\nenable_thinking={thinking}"

    def render(messages: list[Message], add_generation_prompt: bool) -> str:
        return render_text(tok, messages, tools, add_generation_prompt)

    try:
        ids, history, _ = await state.tokenizers.run(
            functools.partial(
                build_prompt,
                tok,
                prev,
                body.instructions,
                new,
                model.name,
                render=render,
                tools=tools_key,
                add_generation_prompt=generate,
            )
        )
    except ValueError as e:  # no template, or the template refused the conversation
        raise ApiError("invalid_request", str(e), param="input") from e
    try:
        # A warm-up prefills the prompt; the one token sampled with it is dropped.
        max_tokens = resolve_max_tokens(
            model.engine, len(ids), body.max_output_tokens if generate else 1, "max_output_tokens"
        )
    except ApiError as e:
        e.param = "input" if e.param == "messages" else e.param  # the prompt's field in this API
        raise
    params = sampling_params(
        body.sampling(),
        max_tokens=max_tokens,
        vocab_size=model.tokenizer.vocab_size,
        structured=structured if generate else None,
        logprobs=body.logprobs if generate else None,
    )
    model.check_request(ids, params, "input")
    admission = model.admission.admit(tier_choice(body.service_tier), len(ids), max_tokens)
    job = Job(state, model, ids, params, admission)
    calls_possible = bool(tools) and choice.mode != "none"
    opens = (not forced and prompt_opens_thinking(tok, ids)) if is_thinking_model(tok) else None
    return PreparedTurn(job, body, new_id("resp"), history, generate, tools_key, calls_possible, opens)
