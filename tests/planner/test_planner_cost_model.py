"""Behaviour of the cost model: the bus curve, bounds, tensor parallel, capacity, MoE, SRAM."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys

import numpy as np
import pytest

from fastmode.planner.catalog import load_hardware, load_model
from fastmode.planner.cost_model import CostModel
from fastmode.planner.moe import expected_distinct_experts
from fastmode.planner.operating_point import bus_curve


def test_bus_curve_per_user_falls_and_aggregate_rises(h100, llama8b):
    points = bus_curve(CostModel(h100, llama8b, tp=1), [1, 2, 4, 8, 16, 32, 64], 1024)
    per_user = [p.per_user_tok_s for p in points]
    aggregate = [p.aggregate_tok_s for p in points]
    assert len(points) == 7
    assert all(a > b for a, b in zip(per_user, per_user[1:]))
    assert all(a < b for a, b in zip(aggregate, aggregate[1:]))


def test_h100_batch1_matches_the_published_calibration_point(h100, llama8b):
    # SGLang, Llama-3.1-8B bf16 on one H100: 158 tok/s (anchors.md) is what eta_m/overhead were fitted to.
    assert 1 / CostModel(h100, llama8b).decode_step_s([512]) == pytest.approx(158, rel=0.03)


def test_memory_to_compute_crossover(h100, llama8b):
    cm = CostModel(h100, llama8b, tp=1)
    cross = cm.crossover_batch(128)
    assert cross is not None and 64 < cross < 1024
    assert cm.step_cost((), [128] * (cross - 1)).bound == "memory"
    assert cm.step_cost((), [128] * cross).bound == "compute"
    # At long contexts each sequence's KV read outweighs its FLOPs: decode never turns compute-bound.
    assert cm.crossover_batch(8192) is None


def test_tensor_parallel_cuts_step_time_and_adds_allreduce(h100):
    m = load_model("llama-3.1-70b")
    tp4, tp8 = CostModel(h100, m, tp=4), CostModel(h100, m, tp=8)
    c4, c8 = tp4.step_cost((), [1024] * 8), tp8.step_cost((), [1024] * 8)
    assert c8.total_s < c4.total_s
    assert c8.mem_s == pytest.approx(c4.mem_s / 2)
    assert c8.comm_s > c4.comm_s > 0
    # 2 all-reduces per layer, each latency + ring transfer of the step's activations.
    msg = 8 * m.hidden_size * 2
    expected = 2 * m.num_layers * (h100.allreduce_latency_s + 2 * 7 / 8 * msg / h100.link_bw_bytes_per_s)
    assert c8.comm_s == pytest.approx(expected)
    assert CostModel(h100, m, tp=1).step_cost((), [1024]).comm_s == 0


def test_tp_beyond_the_nvlink_domain_pays_the_network(h100):
    m = load_model("llama-3.1-405b")
    assert (
        CostModel(h100, m, tp=16).step_cost((), [1024]).comm_s
        > 2 * CostModel(h100, m, tp=8).step_cost((), [1024]).comm_s
    )


def test_405b_does_not_fit_one_h100_and_devices_needed_is_right(h100):
    m = load_model("llama-3.1-405b")
    one = CostModel(h100, m, tp=1)
    assert not one.fits(1, 0)
    expected = math.ceil(m.weight_bytes("bf16") / (80e9 * 0.9))
    assert one.devices_needed() == expected == 12
    assert CostModel(h100, m, tp=expected).fits(1, 0)
    assert not CostModel(h100, m, tp=expected - 1).fits(1, 0)
    assert CostModel(h100, m).num_devices == 16  # auto: next power of two
    assert one.devices_needed(batch=64, context_len=8192) > expected  # KV needs room too
    assert CostModel(h100, m, tp=1, weight_format="fp8").devices_needed() == math.ceil(m.weight_bytes("fp8") / 72e9)


def test_expected_distinct_experts():
    assert expected_distinct_experts(128, 4, 1) == pytest.approx(4)
    values = [expected_distinct_experts(128, 4, t) for t in (1, 2, 8, 64, 1024)]
    assert all(a < b for a, b in zip(values, values[1:]))
    assert values[-1] == pytest.approx(128, rel=1e-6)
    assert expected_distinct_experts(128, 4, 0) == 0


def test_moe_reads_fewer_bytes_than_dense_of_same_total_size(h100):
    glm = load_model("glm-4.7")
    # A dense model of the same total size: every layer gets one wide FFN.
    ffn = round((glm.ffn_params / glm.num_layers) / (3 * glm.hidden_size))
    dense = dataclasses.replace(
        glm,
        name="glm-dense",
        num_experts=0,
        experts_per_token=0,
        expert_ffn_size=0,
        num_shared_experts=0,
        num_dense_layers=0,
        ffn_size=ffn,
    )
    assert dense.total_params == pytest.approx(glm.total_params, rel=0.01)
    moe_cm, dense_cm = CostModel(h100, glm, tp=8), CostModel(h100, dense, tp=8)
    assert moe_cm.weight_bytes_read(1) < 0.2 * dense_cm.weight_bytes_read(1)
    assert moe_cm.decode_step_s([1024]) < dense_cm.decode_step_s([1024])
    # As the batch grows it touches more experts and the saving shrinks.
    assert moe_cm.weight_bytes_read(1) < moe_cm.weight_bytes_read(64) < moe_cm.weight_bytes_read(4096)
    assert moe_cm.weight_bytes_read(4096) == pytest.approx(dense_cm.weight_bytes_read(1), rel=0.02)


def test_prefill_is_compute_bound_and_matches_2NL(h100, llama8b):
    cm = CostModel(h100, llama8b)
    cost = cm.step_cost([(4096, 0)])
    assert cost.bound == "compute"
    linear = 2 * (llama8b.matmul_params_per_token - llama8b.vocab_size * llama8b.hidden_size) * 4096
    assert linear < cost.flops < 1.3 * linear  # attention adds a little at 4k
    assert cm.prefill_step_s(4096) == pytest.approx(cost.total_s)
    assert cm.prefill_time_s(8192, chunk_tokens=4096) > 2 * cm.prefill_step_s(4096)  # 2nd chunk attends to the 1st


def test_mixed_step_shares_the_weight_read(h100, llama8b):
    cm = CostModel(h100, llama8b)
    decode, prefill = cm.decode_step_s([2048] * 16), cm.prefill_step_s(256)
    mixed = cm.step_s(256, [2048] * 16)
    assert max(decode, prefill) <= mixed < decode + prefill
    assert cm.step_s(0, [2048] * 16) == decode
    assert cm.step_s() == 0.0


def test_step_cost_accepts_numpy_and_lists_alike(h100, llama8b):
    cm = CostModel(h100, llama8b)
    assert cm.decode_step_s(np.array([100, 2000, 300])) == pytest.approx(cm.decode_step_s([100, 2000, 300]))


def test_sram_per_user_speed_is_floor_bound():
    wse, m = load_hardware("wse-3"), load_model("llama-3.1-8b")
    cm = CostModel(wse, m)
    cost = cm.step_cost((), [1024])
    assert cost.bound == "latency-floor"
    assert cost.total_s == pytest.approx(m.num_layers * wse.layer_floor_s + wse.overhead_s)
    assert cm.decode_step_s([1024] * 8) == cm.decode_step_s([1024])  # small batches ride free
    no_floor = CostModel(dataclasses.replace(wse, layer_floor_s=0, overhead_s=0), m)
    assert 1 / no_floor.decode_step_s([1024]) > 100 * (1 / cost.total_s)  # bandwidth alone is far off


def test_sram_pipeline_hops_and_microbatches():
    wse, m = load_hardware("wse-3"), load_model("llama-3.1-405b")
    cm = CostModel(wse, m)
    assert cm.num_devices == cm.devices_needed() >= 19
    assert cm.microbatches_in_flight == cm.pipeline_stages == cm.num_devices
    assert cm.step_cost((), [1024]).comm_s == pytest.approx((cm.num_devices - 1) * wse.hop_latency_s)


def test_local_cpu_matches_llama_cpp_anchor_within_25_percent():
    # anchors.md, llama-batched-bench on the q4_1 SmolLM2 GGUF, 2 threads: aggregate decode tok/s.
    cm = CostModel(load_hardware("local"), load_model("smollm2-135m"), weight_format="q4_1")
    for batch, measured in ((1, 185), (16, 337), (32, 345)):
        assert batch / cm.decode_step_s([192] * batch) == pytest.approx(measured, rel=0.25)


def test_validation():
    with pytest.raises(ValueError):
        CostModel(load_hardware("local"), load_model("smollm2-135m"), tp=2)  # no device links
    with pytest.raises(ValueError):
        CostModel(load_hardware("h100"), load_model("smollm2-135m"), eta_m=0)
    with pytest.raises(ValueError):
        CostModel(load_hardware("h100"), load_model("smollm2-135m")).step_cost((), [10], tokens_per_decode_seq=0)


def test_planner_never_imports_torch():
    code = (
        "import sys, fastmode.planner.command, fastmode.planner.chain_command, fastmode.planner.fleet; "
        "from fastmode.planner.command import build_report; assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_slowed_machine_takes_proportionally_longer_for_every_step_shape(h100):
    """Hardware.slowed(f) (re-anchoring a calibration to a drifted machine) scales every step by f:
    memory-bound, compute-bound, tensor-parallel and with calibrated per-step terms."""
    m = load_model("llama-3.1-70b")
    hw = dataclasses.replace(h100, overhead_s=0.002, per_token_s=1e-6, per_seq_s=2e-5, per_kv_token_s=1e-9)
    slow = hw.slowed(1.25)
    for chunks, ctx in (((), [1024] * 4), (((2048, 0),), []), (((256, 512),), [300] * 64)):
        a, b = CostModel(hw, m, tp=8).step_cost(chunks, ctx), CostModel(slow, m, tp=8).step_cost(chunks, ctx)
        assert b.total_s == pytest.approx(1.25 * a.total_s)
        assert b.bound == a.bound
    assert hw.slowed(1.0) == hw
    with pytest.raises(ValueError):
        hw.slowed(0.0)
