"""`fastmode serve` flags come from the config dataclasses."""

from __future__ import annotations

from fastmode.cli import build_parser
from fastmode.engine.config import EngineConfig
from fastmode.server.command import _pick
from fastmode.server.config import ServerConfig


def test_flags_map_onto_both_configs():
    args = build_parser().parse_args([
        "serve", "--port", "9001", "--fast-lane-max-batch", "2", "--max-num-seqs", "8", "--kv-cache-gib", "0.5",
        "--no-enable-prefix-caching", "--max-model-len", "none", "--fast-requests-per-min", "30",
        "--max-waiting-requests", "10", "--api-key", "k",
    ])
    server = ServerConfig(**_pick(ServerConfig, args))
    engine = EngineConfig(**_pick(EngineConfig, args))
    assert (server.port, server.max_waiting_requests, server.api_key) == (9001, 10, "k")
    assert server.fast_requests_per_min == 30.0
    assert (engine.fast_lane_max_batch, engine.max_num_seqs, engine.kv_cache_gib) == (2, 8, 0.5)
    assert engine.enable_prefix_caching is False and engine.max_model_len is None and engine.model is None


def test_every_config_field_has_a_flag():
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]
    dests = {a.dest for a in serve._actions}
    assert set(EngineConfig.field_names()) <= dests
    assert {f for f in ServerConfig.__dataclass_fields__} <= dests
