"""`fastmode calibrate`: measure the real engine, fit the planner's cost model to it.

Module map:

- points            StepPoint: one measured step in cost-model terms (no torch)
- measure           drive LLMEngine: decode batch x context sweep, prefill chunk sweep (torch)
- fit               least-squares fit of overhead, per-token cost, bandwidth, eta_c (numpy)
- pricing           per-tier $/Mtok from step times: the fast lane's multiplier (no torch)
- calibration_file  the calibration JSON of docs/planner.md (no torch)
- run               calibrate_loaded(): measure + fit + calibrated CostModel for a loaded model
- command           `fastmode calibrate`

How the calibrated simulator is checked against the real engine lives in benchmarks/validation/.
"""
