"""Quality evaluation: does the fast route still give correct answers?

The point of the articles on Anthropic's and OpenAI's fast modes is that speed is worth
nothing without correctness: a step that succeeds with probability p succeeds n times in a row with p^n. This
package measures p for the teacher, the distilled Spark student and the
teacher with speculative decoding, on a small suite written for this project:

- `tasks`: the task format and loader (data in `fastmode/data/evals/`);
- `checkers`: one deterministic predicate per answer type;
- `sandbox`: runs model-written code with a timeout and resource limits;
- `stats`: Wilson intervals and the p^n chain;
- `perplexity`: held-out perplexity from the model's log-probs;
- `runner`: `evaluate(llm, tasks, speculative=None)`;
- `report`, `command`: the table, the JSON and `fastmode eval`.

Nothing here imports torch at module level.
"""

from fastmode.evals.runner import ModelReport, evaluate
from fastmode.evals.stats import chain_success, wilson_interval
from fastmode.evals.tasks import Task, load_tasks

__all__ = ["ModelReport", "Task", "chain_success", "evaluate", "load_tasks", "wilson_interval"]
