"""The OpenAI dialect: chat completions and completions (`api.py`), their typed bodies
(`models.py`), the chat output's message and chunks (`chat_output.py`) and OpenAI's
logprob shapes (`logprobs.py`, which the Responses API writes too)."""
