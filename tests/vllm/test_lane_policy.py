"""The vLLM plugin's policy, its settings and its version check, without vLLM (these modules
import neither vLLM nor torch, so they run in fastmode's own venv)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fastmode.engine.scheduler import SchedulerSettings
from fastmode.engine.tiers import Tier
from fastmode.vllm.compat import UnsupportedVllmVersion, check_vllm_version
from fastmode.vllm.lane import LaneConfig, Resident, classify, plan_step

F, S, X = Tier.FAST, Tier.STANDARD, Tier.FLEX


def res(tier: Tier, t: float, last: int = -1, priority: int = 0) -> Resident:
    return Resident(tier, priority, t, last)


def test_policy_modules_import_neither_torch_nor_vllm():
    code = (
        "import sys, fastmode.vllm, fastmode.vllm.lane, fastmode.vllm.compat, fastmode.vllm.middleware; "
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules, sorted(sys.modules)"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_single_machine_server_never_imports_the_plugin():
    code = (
        "import sys; import fastmode.cli, fastmode.server.app; "
        "assert 'fastmode.vllm' not in sys.modules and 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- settings ------------------------------------------------------------------
def test_config_defaults_follow_fastmodes_own_lane():
    cfg = LaneConfig.from_additional_config({})
    assert cfg.lane_max_batch == SchedulerSettings().fast_lane_max_batch
    assert cfg.fast_priority_at_most == -1
    cfg = LaneConfig.from_additional_config({"fastmode": {"lane_max_batch": 2, "fast_priority_at_most": None}})
    assert (cfg.lane_max_batch, cfg.fast_priority_at_most) == (2, None)


@pytest.mark.parametrize(
    "section, message",
    [
        ({"lane_max_batch": 0}, "lane_max_batch must be an integer >= 1"),
        ({"lane_max_batch": "2"}, "lane_max_batch must be an integer >= 1"),
        ({"fast_priority_at_most": 1.5}, "fast_priority_at_most must be an integer or null"),
        ({"lane_width": 2}, "unknown --additional-config \"fastmode\" setting(s) ['lane_width']"),
    ],
)
def test_bad_settings_are_refused_by_name(section, message):
    with pytest.raises(ValueError) as e:
        LaneConfig.from_additional_config({"fastmode": section})
    assert message in str(e.value)


def test_settings_section_must_be_an_object():
    with pytest.raises(ValueError, match="must be an object"):
        LaneConfig.from_additional_config({"fastmode": [2]})


# -- tiers ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "service_tier, priority, tier",
    [
        ("priority", 0, F),
        ("fast", 5, F),  # an explicit tier wins over the priority
        ("flex", -5, X),
        ("default", -5, S),
        (None, -1, F),  # at the threshold
        (None, 0, S),
        ("auto", -3, F),  # auto: by priority
        ("auto", 0, S),
    ],
)
def test_classify(service_tier, priority, tier):
    assert classify(service_tier, priority, LaneConfig()) is tier


def test_classify_without_a_priority_threshold_uses_service_tier_only():
    cfg = LaneConfig(fast_priority_at_most=None)
    assert classify(None, -100, cfg) is S
    assert classify("priority", 0, cfg) is F


def test_classify_refuses_a_tier_not_offered():
    with pytest.raises(ValueError, match="service_tier 'scale' is not offered"):
        classify("scale", 0, LaneConfig())


# -- the step plan --------------------------------------------------------------
def test_without_fast_work_every_resident_runs_in_importance_order():
    rs = [res(S, 3.0), res(X, 0.0), res(S, 1.0)]
    plan = plan_step(rs, num_fast_waiting=0, lane_max_batch=2, max_num_seqs=8)
    assert not plan.lane_active
    assert plan.step == [2, 0, 1] and plan.paused == [] and plan.evict == []
    assert plan.num_admit == 5


def test_fast_resident_caps_the_step_and_others_pause_keeping_their_slot():
    rs = [res(S, float(i), last=i) for i in range(6)] + [res(F, 9.0)]
    plan = plan_step(rs, num_fast_waiting=0, lane_max_batch=2, max_num_seqs=16)
    assert plan.lane_active
    assert plan.step[0] == 6  # fast first
    assert len(plan.step) == 2 and plan.num_admit == 0
    assert sorted(plan.step + plan.paused) == list(range(7)) and plan.evict == []


def test_lower_tiers_rotate_least_recently_served_first():
    rs = [res(S, 0.0, last=5), res(S, 1.0, last=3), res(S, 2.0, last=4), res(F, 3.0, last=5)]
    plan = plan_step(rs, num_fast_waiting=0, lane_max_batch=2, max_num_seqs=8)
    assert plan.step == [3, 1]  # the standard one served longest ago


def test_slots_are_kept_for_waiting_fast_requests():
    rs = [res(S, float(i)) for i in range(4)]
    plan = plan_step(rs, num_fast_waiting=1, lane_max_batch=2, max_num_seqs=8)
    assert len(plan.step) == 1 and plan.num_admit == 1


def test_a_waiting_fast_request_preempts_the_least_important_paused_resident_when_slots_bind():
    # Every resident slot taken: flex goes before standard, then the later arrival.
    rs = [res(S, 0.0), res(X, 1.0), res(S, 2.0), res(X, 3.0)]
    plan = plan_step(rs, num_fast_waiting=1, lane_max_batch=2, max_num_seqs=4)
    assert plan.evict == [3]
    assert plan.num_admit == 1 and len(plan.step) == 1
    assert plan.victims == [1, 2]  # then, should memory be short: the other flex, then standard


def test_fast_residents_are_never_evicted_or_victims():
    rs = [res(F, 0.0), res(F, 1.0), res(F, 2.0)]
    plan = plan_step(rs, num_fast_waiting=1, lane_max_batch=2, max_num_seqs=3)
    assert plan.evict == [] and plan.victims == []
    assert len(plan.step) == 2 and plan.paused and plan.num_admit == 0


def test_priority_orders_within_a_tier_only_when_asked():
    rs = [res(S, 0.0, priority=5), res(S, 1.0, priority=-5)]
    assert plan_step(rs, 0, 2, 8, by_priority=True).step == [1, 0]
    assert plan_step(rs, 0, 2, 8, by_priority=False).step == [0, 1]


# -- version ---------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.32.0", "0.32.4", "0.32.1.dev3+gabc123"])
def test_supported_versions_load(version):
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0", "1.0.0", "dev"])
def test_other_versions_are_refused_clearly(version):
    with pytest.raises(UnsupportedVllmVersion, match=rf"supports vLLM 0\.32\.x; this is vLLM {version}"):
        check_vllm_version(version)
