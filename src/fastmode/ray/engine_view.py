"""What the ingress knows of an engine that runs in a pool replica.

The server's routes read a few things of a model's engine before a request
reaches it: the tokenizer (chat templates, tool grammars), the context length,
the request checks (a 400 before any stream starts) and the scheduler config
(admission's capacities). A pool replica sends them once as an `EngineCard`;
`EngineView` answers the server's questions from it with the engine's own
checks, so a request the replicas would refuse is refused at the ingress in
the same words.
"""

from __future__ import annotations

from types import SimpleNamespace

from fastmode.engine.llm_engine import LLMEngine
from fastmode.engine.scheduler import Scheduler
from fastmode.ray.wire import EngineCard


class EngineView:
    """The parts of `LLMEngine` the server reads, for an engine in another process."""

    def __init__(self, card: EngineCard):
        self.card = card
        self.tokenizer = card.tokenizer
        self.scheduler_config = card.scheduler_config
        # A scheduler of the same config: its prompt-length check reads only the config.
        self.scheduler = Scheduler(card.scheduler_config, card.tokenizer.eos_token_ids)
        self.loaded = SimpleNamespace(name=card.model_name, config=SimpleNamespace(vocab_size=card.vocab_size))
        self.drafter = True if card.has_drafter else None  # check_request asks only whether there is one

    @property
    def model_name(self) -> str:
        return self.card.model_name

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    # The engine's one validation, reading `loaded.config.vocab_size`, `scheduler` and `drafter`
    # above: a second copy of the rules here would drift from the engine's.
    check_request = LLMEngine.check_request
