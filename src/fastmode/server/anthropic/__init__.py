"""The Anthropic dialect: `POST /v1/messages` and token counting (`api.py`) and its typed
bodies (`models.py`)."""
