"""How many distinct experts a batch touches, which sets the MoE bytes read per step.

A decode step must stream every expert that at least one token in the step was
routed to. With uniform, independent routing, each of `tokens` tokens picks
`top_k` of `num_experts` experts, so one expert is missed by a token with
probability (1 - k/E) and by all of them with (1 - k/E)^tokens:

    E[distinct] = E * (1 - (1 - k/E)^tokens)

This is 1 token -> k experts and grows towards E as the batch grows. Real routers
are skewed (popular experts), which makes the true count smaller; the uniform
figure is therefore an upper bound on bytes read, i.e. conservative for speed.
"""

from __future__ import annotations


def expected_distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected number of distinct experts hit by `tokens` tokens in one layer.

    Invariants: returns top_k for one token, is non-decreasing in `tokens`, and
    never exceeds `num_experts`. Zero tokens touch zero experts.
    """
    if num_experts <= 0 or not 0 < top_k <= num_experts:
        raise ValueError("need num_experts > 0 and 0 < top_k <= num_experts")
    if tokens < 0:
        raise ValueError("tokens must be >= 0")
    if tokens == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
