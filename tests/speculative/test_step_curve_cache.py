"""The start-up step curve is kept per engine kind in the cache directory and measured again
when the engine differs, the curve is stale, lacks a row count, or the cache is unreadable."""

from __future__ import annotations

from fastmode.speculative.step_timing import MAX_AGE_S, cached_step_curve, curve_key

PARTS = {"model": ["/m.gguf", 100, 1], "threads": 2, "isa": "avx2"}
ROWS3 = [(False, 1), (True, 2), (True, 4)]  # step shapes: (verifies drafts, rows)
ROWS2 = [(False, 1), (True, 2)]


class Meter:
    def __init__(self):
        self.calls = []

    def __call__(self, rows):
        self.calls.append(list(rows))
        return {shape: 0.01 * shape[1] + 0.001 * len(self.calls) for shape in rows}, 1.05  # a steady machine


def test_a_second_engine_of_the_same_kind_reads_the_curve(tmp_path):
    meter = Meter()
    first, cached = cached_step_curve(tmp_path, PARTS, ROWS3, meter, now_s=1000.0)
    assert not cached and meter.calls == [ROWS3]
    again, cached = cached_step_curve(tmp_path, PARTS, ROWS3, meter, now_s=2000.0)
    assert cached and again == first and len(meter.calls) == 1
    fewer, cached = cached_step_curve(tmp_path, PARTS, ROWS2, meter, now_s=2000.0)
    assert len(meter.calls) == 2  # another row set is another key: measured


def test_another_engine_kind_a_stale_curve_or_a_broken_file_is_measured(tmp_path):
    meter = Meter()
    cached_step_curve(tmp_path, PARTS, ROWS2, meter, now_s=0.0)
    _, cached = cached_step_curve(tmp_path, {**PARTS, "threads": 1}, ROWS2, meter, now_s=1.0)
    assert not cached and len(meter.calls) == 2
    _, cached = cached_step_curve(tmp_path, PARTS, ROWS2, meter, now_s=MAX_AGE_S + 1.0)
    assert not cached and len(meter.calls) == 3
    path = tmp_path / "step_curves" / f"{curve_key({**PARTS, 'shapes': ROWS2})}.json"
    path.write_text("{not json")
    curve, cached = cached_step_curve(tmp_path, PARTS, ROWS2, meter, now_s=MAX_AGE_S + 2.0)
    assert not cached and len(meter.calls) == 4 and set(curve) == set(ROWS2)
    _, cached = cached_step_curve(tmp_path, PARTS, ROWS2, meter, now_s=MAX_AGE_S + 3.0)
    assert cached  # the rewritten file is good again


def test_without_a_cache_every_engine_measures(tmp_path):
    meter = Meter()
    for _ in range(2):
        _, cached = cached_step_curve(None, PARTS, [(False, 1)], meter)
        assert not cached
    assert len(meter.calls) == 2
    # An empty measurement (a KV pool too small) is not saved.
    _, cached = cached_step_curve(tmp_path, PARTS, [(True, 3)], lambda rows: ({}, float("inf")))
    assert not cached and not (tmp_path / "step_curves").exists()


def test_a_curve_timed_on_a_busy_machine_is_used_but_not_saved(tmp_path):
    """Repeats that spread widely mean other work shared the cores: every engine after this one
    would otherwise price verification from that busy minute for a week."""
    busy = {(False, 1): 0.19, (True, 2): 0.14, (True, 4): 0.26}
    curve, cached = cached_step_curve(tmp_path, PARTS, ROWS3, lambda rows: (busy, 3.0), now_s=0.0)
    assert curve == busy and not cached
    meter = Meter()
    curve, cached = cached_step_curve(tmp_path, PARTS, ROWS3, meter, now_s=1.0)
    assert not cached and len(meter.calls) == 1  # nothing was saved: measured again
    _, cached = cached_step_curve(tmp_path, PARTS, ROWS3, meter, now_s=2.0)
    assert cached  # a steady measurement is saved
