"""The agent task suite: multi-step tool-use tasks run through the server, per route.

- `world`: the deterministic sandbox the tools act on;
- `tasks`: the task format, loader and scorer (`data/evals/agent/tasks.jsonl`);
- `make_tasks`: the seeded generator of that file;
- `loop`: one agent run of a task over the Chat Completions API, with an optional verifier-and-retry;
- `routes`: the routes compared, the server the eval starts and the background load;
- `report`: per-route accuracy, p^n against observed success, time and cost to a correct result;
- `command`: `fastmode eval --agent`.

Nothing here imports torch: the model runs in the server.
"""
