"""The OpenAI Responses API, over HTTP (`api.py`) and a WebSocket (`ws.py`), both running one
turn implementation: `prepare.py` checks and admits a request, `turn.py` runs it and
`events.py` writes its output items and stream events. `models.py` and `input_items.py` are
the typed bodies; `conversation.py` continues a conversation on the previous turn's exact
tokens and keeps the stored responses."""
