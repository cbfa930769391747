"""The weight format calibration prices a natively run GGUF at: the bytes its layers read per
step, by weight class, for every block type the kernels run (Q5_0, Q5_1 and the K-quants too),
checked against the tensor sizes stored in the file itself."""

from __future__ import annotations

import pytest

from fastmode.calibrate.run import engine_model_spec, kernel_regimes, native_format
from fastmode.kernels import ops
from fastmode.loader import load_model
from fastmode.planner.weight_format import FORMATS
from tests.builders import write_gguf_from_hf
from tests.loader.test_gguf_kquant import kquant_llama_dir, q4_k_m, write_gguf  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(ops() is None, reason="kernels unavailable")


def file_figures(path) -> dict[str, float]:
    """Bytes per weight of each class, from the GGUF file's own tensors."""
    from gguf import GGUFReader

    sums = {"embed": [0, 0], "attn": [0, 0], "ffn": [0, 0]}
    for t in GGUFReader(str(path)).tensors:
        if len(t.shape) != 2 or t.name == "token_embd.weight":  # the tied-or-not input embedding is not read whole
            continue
        kind = "attn" if ".attn_" in t.name else "ffn" if ".ffn_" in t.name else "embed"
        sums[kind][0] += int(t.n_bytes)
        sums[kind][1] += int(t.n_elements)
    return {k: b / n for k, (b, n) in sums.items()}


@pytest.mark.parametrize("mix", ["Q4_K_M", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"])
def test_native_blocks_are_priced_at_the_file_s_sizes(kquant_llama_dir, tmp_path, mix):  # noqa: F811
    choose = q4_k_m if mix == "Q4_K_M" else (lambda name: mix)
    path = write_gguf(kquant_llama_dir, tmp_path / f"tiny-{mix}.gguf", choose)
    loaded = load_model(str(path), "float32")
    spec, fmt = engine_model_spec(loaded)
    assert not isinstance(fmt, str) and fmt.name.endswith("-native") and fmt.compute_dtype == "fp32"
    assert fmt.name == loaded.weight_format.lower() + "-native"
    want = file_figures(path)
    got = {"embed": fmt.embed_bytes_per_param, "attn": fmt.attn_bytes_per_param, "ffn": fmt.ffn_bytes_per_param}
    assert got == pytest.approx(want, rel=1e-12)
    if mix != "Q4_K_M":  # one type throughout: its block size
        per, size = {"Q5_0": (32, 22), "Q5_1": (32, 24), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}[
            mix
        ]
        assert set(got.values()) == {size / per}
    assert spec.weight_bytes() == pytest.approx(
        sum(want[k] * n for k, n in (("attn", spec.attn_params), ("ffn", spec.ffn_params)))
        + want["embed"] * spec.embedding_params
    )
    assert kernel_regimes(fmt) == (int(ops().direct_max_rows()), int(ops().amx_tile_rows()))


def test_named_and_dequantized_formats(tiny_llama_dir, tmp_path):
    q8 = write_gguf_from_hf(tiny_llama_dir, tmp_path / "tiny-q8.gguf", "Q8_0")
    spec, fmt = engine_model_spec(load_model(str(q8), "float32"))
    assert fmt == "q8_0-native" and spec.default_format == fmt and fmt in FORMATS
    spec, fmt = engine_model_spec(load_model(str(q8), "float32", weights="dequantize"))
    assert fmt == "fp32" and native_format(load_model(str(q8), "float32", weights="dequantize").model) is None
    assert kernel_regimes(fmt) == (0, 0)


def test_the_planner_s_named_format_is_what_the_embedded_model_holds():
    loaded = load_model(None, "float32")  # the embedded model: Q4_1 layers, a Q8_0 head
    spec, fmt = engine_model_spec(loaded)
    named, measured = FORMATS[fmt], native_format(loaded.model)
    assert fmt == "q4_1-native" and measured.name == "q4_1+q8_0-native"
    for field in ("embed_bytes_per_param", "attn_bytes_per_param", "ffn_bytes_per_param"):
        assert getattr(named, field) == pytest.approx(getattr(measured, field), rel=1e-12), field


def test_a_k_quant_model_calibrates_at_its_measured_format(kquant_llama_dir, tmp_path):  # noqa: F811
    """The whole run on a Q4_K_M mix: a small real sweep, the fit, and the calibration file naming
    the format the cost model priced the weights at."""
    import json

    from fastmode.calibrate.measure import SweepConfig
    from fastmode.calibrate.run import calibrate_loaded

    loaded = load_model(str(write_gguf(kquant_llama_dir, tmp_path / "tiny-q4_k_m.gguf", q4_k_m)), "float32")
    sweep = SweepConfig(
        batches=(1, 2, 4, 8, 12, 16),
        contexts=(16,),
        chunk_sizes=(8, 16),
        prefill_tokens_per_size=16,
        repeats=2,
        warmup=1,
        prefill_repeats=1,
        num_threads=1,
    )
    run = calibrate_loaded(loaded, sweep, split_tokens=0)
    measured = native_format(loaded.model)
    assert run.weight_format == measured.name == run.calibration["weight_format"]
    assert run.cost_model.fmt == measured and run.spec.weight_bytes() == run.spec.weight_bytes(measured)
    assert run.spec.weight_bytes() < run.spec.weight_bytes("fp32") / 5  # blocks, not an fp32 copy
    assert json.loads(json.dumps(run.calibration))["weight_format"] == measured.name


def test_a_calibration_file_keeps_an_unnamed_format_for_the_simulator(kquant_llama_dir, tmp_path, capsys):  # noqa: F811
    """A mix of block types has no name in the planner's catalog: the calibration file stores its
    per-class figures, and `fastmode simulate --calibration` prices the weights with them."""
    import json

    from fastmode.calibrate.calibration_file import calibration_dict
    from fastmode.calibrate.fit import FitResult
    from fastmode.cli import main
    from fastmode.planner.weight_format import FORMATS, format_from_calibration

    loaded = load_model(str(write_gguf(kquant_llama_dir, tmp_path / "tiny-q4_k_m.gguf", q4_k_m)), "float32")
    fmt = native_format(loaded.model)
    assert fmt.name not in FORMATS
    fit = FitResult(20.0, 0.5, 0.001, 0.0, 0.0, 0.0, rel_errors=())
    cal = json.loads(json.dumps(calibration_dict(fit, [], "local", loaded.name, fmt, "test")))
    back = format_from_calibration(cal)
    assert (back.name, back.embed_bytes_per_param, back.attn_bytes_per_param, back.ffn_bytes_per_param) == (
        fmt.name,
        fmt.embed_bytes_per_param,
        fmt.attn_bytes_per_param,
        fmt.ffn_bytes_per_param,
    )
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(cal))
    args = ["simulate", "--model", "smollm2-135m", "--hardware", "local", "--calibration", str(path)]
    assert main(args + ["--num-requests", "20", "--rate", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["weight_format"] == fmt.name
