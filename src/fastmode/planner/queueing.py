"""Erlang C (M/M/c): how long a request waits for a free batch slot.

A replica with batch cap B is treated as B servers (slots); a pool of R replicas
as c = R*B servers fed by one Poisson stream. Service time is how long a request
holds its slot (prefill plus decode). Continuous batching makes "a slot frees
up, the next request joins" a fair description; exponential service times are
the approximation (real output lengths are closer to lognormal, so the tail
waits are optimistic and the means about right).
"""

from __future__ import annotations

import math


def erlang_c(servers: int, offered_load: float) -> float:
    """Probability an arrival must wait, for `servers` slots and offered load a = lambda*S.

    Uses the stable Erlang-B recursion B(n) = a*B(n-1) / (n + a*B(n-1)), then
    C = c*B / (c - a*(1 - B)). Returns 1.0 when the system is overloaded (a >= c).
    """
    if servers < 1:
        raise ValueError("servers must be >= 1")
    if offered_load < 0:
        raise ValueError("offered_load must be >= 0")
    if offered_load == 0:
        return 0.0
    if offered_load >= servers:
        return 1.0
    b = 1.0
    for n in range(1, servers + 1):
        b = offered_load * b / (n + offered_load * b)
    return servers * b / (servers - offered_load * (1 - b))


def mean_wait_s(servers: int, arrival_rate_per_s: float, service_s: float) -> float:
    """Mean time in queue before getting a slot (M/M/c); inf when overloaded."""
    a = arrival_rate_per_s * service_s
    if a >= servers:
        return math.inf
    if a == 0:
        return 0.0
    return erlang_c(servers, a) * service_s / (servers - a)


def wait_quantile_s(servers: int, arrival_rate_per_s: float, service_s: float, q: float = 0.9) -> float:
    """q-quantile of the queueing wait: P(W > t) = C * exp(-(c*mu - lambda) t)."""
    if not 0 < q < 1:
        raise ValueError("q must be in (0, 1)")
    a = arrival_rate_per_s * service_s
    if a >= servers:
        return math.inf
    c_prob = erlang_c(servers, a) if a > 0 else 0.0
    if c_prob <= 1 - q:
        return 0.0
    rate = servers / service_s - arrival_rate_per_s
    return math.log(c_prob / (1 - q)) / rate
