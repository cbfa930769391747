"""`fastmode serve` flags come from the config dataclasses."""

from __future__ import annotations

import pytest

from fastmode.cli import build_parser
from fastmode.engine.config import EngineConfig
from fastmode.flags import pick as _pick
from fastmode.server.config import ServerConfig
from tests.server.conftest import export_spark, tiny_loaded, tiny_spark  # noqa: F401 (fixtures)


@pytest.fixture(scope="module")
def parser():
    """One `fastmode` parser for the module: building one reads every options dataclass's source
    for the flags' help (seconds each time); parse_args leaves the parser as it was."""
    return build_parser()


def test_flags_map_onto_both_configs(parser):
    args = parser.parse_args(
        [
            "serve",
            "--port",
            "9001",
            "--fast-lane-max-batch",
            "2",
            "--max-num-seqs",
            "8",
            "--kv-cache-gib",
            "0.5",
            "--no-enable-prefix-caching",
            "--max-model-len",
            "none",
            "--fast-requests-per-min",
            "30",
            "--max-waiting-requests",
            "10",
            "--api-key",
            "k",
        ]
    )
    server = ServerConfig(**_pick(ServerConfig, args))
    engine = EngineConfig(**_pick(EngineConfig, args))
    assert (server.port, server.max_waiting_requests, server.api_key) == (9001, 10, "k")
    assert server.fast_requests_per_min == 30.0
    assert (engine.scheduling.fast_lane_max_batch, engine.scheduling.max_num_seqs, engine.cache.kv_cache_gib) == (
        2,
        8,
        0.5,
    )
    assert (
        engine.scheduling.enable_prefix_caching is False and engine.max_model_len is None and engine.load.model is None
    )


def test_speculation_flags_keep_their_short_forms(parser):
    args = parser.parse_args(
        [
            "serve",
            "--speculative",
            "draft",
            "--num-speculative-tokens",
            "3",
            "--speculative-tiers",
            "standard,fast",
            "--speculative-max-batch",
            "2",
            "--speculative-min-gain",
            "0",
            "--draft-model",
            "layers:1",
        ]
    )
    spec = EngineConfig(**_pick(EngineConfig, args)).speculation
    assert (spec.method, spec.max_draft_tokens, spec.tiers, spec.max_batch, spec.min_gain) == (
        "draft",
        3,
        ("standard", "fast"),
        2,
        0.0,
    )
    assert EngineConfig(**_pick(EngineConfig, args)).load.draft_model == "layers:1"
    long_form = parser.parse_args(["serve", "--speculative-method", "off", "--speculative-max-draft-tokens", "2"])
    spec = EngineConfig(**_pick(EngineConfig, long_form)).speculation
    assert (spec.method, spec.max_draft_tokens) == ("off", 2)


def test_flat_keywords_set_the_parts_and_defaults_live_in_the_parts():
    from fastmode.engine.config import CacheConfig, LoadConfig
    from fastmode.engine.scheduler import SchedulerConfig, SchedulerSettings
    from fastmode.speculative.policy import SpecConfig

    config = EngineConfig(model="m", max_num_seqs=8, kv_cache_gib=0.5, speculative="off", speculative_tiers="standard")
    assert config.load == LoadConfig(model="m") and config.cache == CacheConfig(kv_cache_gib=0.5)
    assert config.scheduling == SchedulerSettings(max_num_seqs=8)
    assert config.speculation == SpecConfig(method="off", tiers=("standard",))
    assert EngineConfig() == EngineConfig(load=LoadConfig(), scheduling=SchedulerSettings())
    # The scheduler's settings are declared once: the engine's scheduler gets them as set.
    sched = config.scheduler_config(kv_bytes_per_token=2**10, model_max_len=2048)
    assert isinstance(sched, SchedulerConfig) and sched.max_num_seqs == 8 and sched.max_model_len == 2048
    assert sched.num_blocks == 0.5 * 2**30 // (2**10 * sched.block_size)
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_num_seq'"):
        EngineConfig(max_num_seq=8)
    with pytest.raises(ValueError, match="dtype must be one of"):
        EngineConfig(dtype="float64")


def test_every_config_field_has_a_flag(parser):
    serve = parser._subparsers._group_actions[0].choices["serve"]
    dests = {a.dest for a in serve._actions}
    assert set(EngineConfig.field_names()) <= dests
    assert {f for f in ServerConfig.__dataclass_fields__} <= dests


def test_serve_spark_flag(parser):
    assert ServerConfig(**_pick(ServerConfig, parser.parse_args(["serve"]))).serve_spark is True
    args = parser.parse_args(["serve", "--no-serve-spark"])
    assert ServerConfig(**_pick(ServerConfig, args)).serve_spark is False


def test_spark_engine_serves_the_default_models_spark_when_present(
    tiny_llama_dir, tiny_loaded, tiny_spark, tmp_path, monkeypatch, capsys
):
    import fastmode.distill.spark as spark
    import fastmode.loader.default_model as default_model
    from fastmode.commands.serve import spark_engine
    from fastmode.engine.llm_engine import LLMEngine

    config = EngineConfig(
        model=str(tiny_loaded.path), dtype="float32", kv_cache_gib=0.01, num_threads=1, draft_model=None
    )
    main = LLMEngine(config, loaded=tiny_loaded)
    monkeypatch.setattr(spark, "find_spark", lambda name=None: tiny_spark.path)
    assert spark_engine(main, config) is None  # the main model is not the default model
    monkeypatch.setattr(default_model, "DEFAULT_MODEL_NAME", tiny_loaded.name)
    served = spark_engine(main, config)
    assert served is not None and served.model_name == tiny_loaded.name + "-spark"
    assert served.config.speculation.method == "off" and served.drafter is None
    assert served.loaded.model.embed_tokens is tiny_loaded.model.embed_tokens  # shared, not copied
    monkeypatch.setattr(spark, "find_spark", lambda name=None: None)
    assert spark_engine(main, config) is None  # no weights: only the main model, no error
    other = export_spark(tiny_llama_dir, tmp_path, teacher={"name": "x.gguf", "sha256": "0" * 64})
    monkeypatch.setattr(spark, "find_spark", lambda name=None: other)
    assert spark_engine(main, config) is None  # distilled from another checkpoint: skipped with a warning
    assert "not serving Spark" in capsys.readouterr().err


def test_generate_and_chat_flags_come_from_the_same_dataclasses(parser):
    from fastmode.commands.common import sampling_from_args
    from fastmode.engine.config import LoadConfig

    args = parser.parse_args(
        [
            "generate",
            "hi",
            "--dtype",
            "float32",
            "--weights",
            "dequantize",
            "--stop",
            "a,b",
            "--stop",
            "c",
            "--temperature",
            "0.5",
            "--max-tokens",
            "7",
            "--tier",
            "fast",
        ]
    )
    assert _pick(LoadConfig, args) == {"model": None, "dtype": "float32", "weights": "dequantize"}
    params = sampling_from_args(args)
    assert (params.stop, params.temperature, params.max_tokens, args.tier) == (("a,b", "c"), 0.5, 7, "fast")
    chat = sampling_from_args(parser.parse_args(["chat"]))
    assert (chat.temperature, chat.max_tokens, chat.stop) == (0.0, 128, ())  # greedy and short on the command line
    with pytest.raises(SystemExit):  # the one list of dtypes gives the choices
        parser.parse_args(["generate", "hi", "--dtype", "float64"])


def test_ctrl_c_stops_the_server_cleanly(tiny_llama_dir):
    """SIGINT (Ctrl-C) shuts `fastmode serve` down without a traceback: exit 0, or 130 where uvicorn
    re-raises the signal after its shutdown."""
    import signal
    import socket
    import subprocess
    import sys
    import time

    import httpx

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "fastmode.cli", "serve", "--model", str(tiny_llama_dir), "--port", str(port)]
    cmd += ["--speculative", "off", "--kv-cache-gib", "0.01", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        else:
            pytest.fail("the server did not come up")
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode in (0, 130), err
    assert "Traceback" not in err, err
