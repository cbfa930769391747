"""`fastmode bench`: a load generator for any OpenAI-compatible endpoint.

Module map, in the order a run uses them:

- workload   what to send: prompts (project set, a file, synthetic lengths), max_tokens, tier mix; seeded
- client     one streaming request over HTTP, timed chunk by chunk (httpx, SSE)
- load       how to send it: closed loop (N workers) or open loop (Poisson arrivals at R req/s)
- stats      per-tier percentiles, goodput under SLOs, aggregate throughput, errors
- plots      latency against throughput over a sweep, per-tier CDFs (matplotlib, Agg)
- command    the `fastmode bench` flags, the table and the JSON

No torch, no model weights: the client never tokenizes, so it can measure a
peer (llama.cpp's llama-server, vLLM) exactly as it measures fastmode. See
docs/bench.md for the metric definitions.
"""
