"""Defaults shared by the command line and the pipeline (no torch here: `fastmode --help` must stay fast)."""

# Share of training windows per source. Teacher answers carry the chat format
# the student is served in; code and prose keep it general.
DEFAULT_MIX: dict[str, float] = {"answers": 0.4, "stdlib": 0.3, "shakespeare": 0.3}
