"""Speculative decoding: proposers of draft tokens and the policy that decides when to use them.

Verification is in the model runner (engine/model_runner.py, `_verify`): the
target model scores every draft in one step and keeps the longest prefix that
greedy decoding or rejection sampling would have produced, so output is
unchanged by construction.
"""
