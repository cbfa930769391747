"""The error a request raises when the engine can never run it as given. No torch.

Typed so that each API dialect can answer it in its own format (a 400 with
`param` and `code`), and the Python API still sees a plain ValueError.
"""

from __future__ import annotations


class RequestError(ValueError):
    """A request this engine can never run: an empty prompt, token ids outside the
    vocabulary, a prompt longer than the context or the KV cache, a speculation
    method the engine lacks.

    `param` names the request field at fault in the engine's terms ("prompt",
    "speculative", ...); `code` is a stable machine-readable reason where one
    exists (OpenAI's `context_length_exceeded`, `unsupported_parameter`).
    """

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code
