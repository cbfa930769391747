"""The HTTP/WebSocket server: OpenAI and Anthropic dialects over tiered engines, one per served model.

Layout follows a request: config (flags) -> app (routes, lifespan) -> state
(the served models: served_model) ->
openai_api / anthropic_api / responses_ws (dialects) -> admission (tier,
lane, queue, rate limits) -> generation (engine stream, disconnects) ->
metrics; errors renders every failure in the caller's dialect.
"""

from fastmode.server.config import ServerConfig


def create_app(*args, **kwargs):
    """See fastmode.server.app.create_app (imported lazily: it pulls in torch)."""
    from fastmode.server.app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["ServerConfig", "create_app"]
