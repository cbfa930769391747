"""Checks of the simulator against the real engine: scripts and the machinery only they use.

- sim_validation        the check: calibrate, replay a tiered load on the engine, simulate it, compare
- sim_validation_refit  re-fit a saved sim_validation run on chosen rounds (no engine runs)
- load_twin_steps       a load's decode steps against a calibration-style engine's, in the same minutes
- replay                replay a workload on the real engine by wall or CPU clock (torch)
- probe                 a fixed pair of steps timed again and again: the machine's speed over time (torch)
- pace                  simulate at a pace that changes over time (a speed profile); no torch

Run the scripts from the repository root, e.g. `python benchmarks/validation/sim_validation.py --help`.
"""
