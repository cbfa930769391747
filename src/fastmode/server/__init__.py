"""The HTTP/WebSocket server: OpenAI and Anthropic dialects over tiered engines, one per served model.

Layout follows a request: config (flags) -> app (routes, lifespan) -> state (the
served models: served_model) -> a dialect package (openai/, anthropic/, responses/),
which renders prompts and grammars with tools/ and maps its sampling fields to
SamplingParams -> edge/admission (tier, lane, queue, rate limits) -> generation (engine
stream, disconnects) -> metrics. edge/ is what stands between the network and the
engine: errors in the caller's dialect, host and origin checks, input limits, slow
clients, admission, rate limits and the drain on shutdown.
"""

from fastmode.server.config import ServerConfig


def create_app(*args, **kwargs):
    """See fastmode.server.app.create_app (imported lazily: it pulls in torch)."""
    from fastmode.server.app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["ServerConfig", "create_app"]
