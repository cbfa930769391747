"""Tools for every dialect: the offered tools and tool choice (`specs.py`), the one
`<tool_call>` layout (`call_format.py`), tools in the prompt (`prompt.py`), each turn's
tool-call grammar (`grammar.py`) and calls parsed out of the output as it streams
(`call_parser.py`). Nothing here knows a dialect's wire format."""
