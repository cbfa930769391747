"""Put each quantitative claim of the two articles on Anthropic's and OpenAI's fast modes beside
what fastmode's planner predicts.

    .venv/bin/python scripts/seed_claims.py            # rewrites docs/seed-claims.md
    .venv/bin/python scripts/seed_claims.py --stdout   # prints it instead

Takes a few seconds on a CPU; uses only the cost model (no engine, no torch).
Every number in the output is computed here, from the catalogs in
src/fastmode/data/catalog/, so rerun it after changing them.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from fastmode.planner.catalog import calibration_points, hardware_names, load_hardware, load_model, model_names
from fastmode.planner.chain import compare, seed_modes, seed_table
from fastmode.planner.cost_model import CostModel
from fastmode.planner.operating_point import evaluate, layout_for_load
from fastmode.planner.speculative import SpecConfig
from fastmode.planner.sram_fit import fit_sram, points_from_catalog, predict_tok_s

OUT = Path(__file__).resolve().parent.parent / "docs" / "seed-claims.md"


def _batch_for_slowdown(cm, b_fast: int, ctx: int, ratio: float = 2.5):
    """Smallest standard batch whose per-user speed is <= fast-lane speed / ratio."""
    fast = evaluate(cm, b_fast, ctx)
    b = b_fast
    while True:
        b += 1
        std = evaluate(cm, b, ctx)
        if std.per_user_tok_s <= fast.per_user_tok_s / ratio or not std.fits or b > 4096:
            return fast, std


def claim_low_batch() -> list[str]:
    rows, found = [], []  # found: (model, ctx, b_fast, b_std, speed ratio, price ratio) where 2.5x is reached
    grid = [("llama-3.1-70b", "h100", "bf16", 8), ("llama-3.1-405b", "h200", "fp8", 8), ("glm-4.7", "h200", "fp8", 8)]
    for model, hw, fmt, tp in grid:
        for ctx in (8192, 32768):
            cm = layout_for_load(load_hardware(hw), load_model(model), 1, ctx, tp=tp, weight_format=fmt)
            for b_fast in (1, 2, 4):
                fast, std = _batch_for_slowdown(cm, b_fast, ctx)
                speed = fast.per_user_tok_s / std.per_user_tok_s
                price = std.aggregate_tok_s / fast.aggregate_tok_s
                note = "" if std.fits else " (standard batch no longer fits: 2.5x not reached)"
                if std.fits:
                    found.append((model, ctx, b_fast, std.batch, speed, price))
                rows.append(
                    f"| {model} {fmt} | {tp}x {hw} | {ctx} | {b_fast} | {std.batch} | "
                    f"{fast.per_user_tok_s:.0f} / {std.per_user_tok_s:.0f} | {speed:.2f}x | {price:.1f}x{note} |"
                )
    best = min(found, key=lambda f: abs(f[5] - 6))
    dense_8k = [f[5] for f in found if f[0] != "glm-4.7" and f[1] == 8192]
    moe = [f[5] for f in found if f[0] == "glm-4.7"]
    verdict = [
        "**Verdict: consistent, not pinned down.** The pair closest to (2.5x, 6x) is "
        f"{best[0]} at {best[1]}-token contexts with a fast lane of {best[2]} and a standard lane of {best[3]} "
        f"sequences ({best[4]:.2f}x speed for {best[5]:.1f}x price). For dense models at 8k contexts the same",
        f"2.5x is worth {min(dense_8k):.0f}-{max(dense_8k):.0f}x in price (weights dominate the step, so batching is",
        f"nearly free); for the MoE (GLM-4.7) only {min(moe):.1f}-{max(moe):.1f}x (each extra sequence touches more",
        "experts, so batching buys less). 6x therefore says as much about context length and architecture as",
        "about batch size; the low-batch explanation fits, but the numbers alone cannot confirm it.",
    ]
    # The speculative alternative on the configuration closest to (2.5x, 6x).
    cm = layout_for_load(load_hardware("h100"), load_model("llama-3.1-70b"), 1, 32768, tp=8)
    spec = SpecConfig(acceptance=0.8, draft_len=4, draft_cost_ratio=0.05)
    spec_rows = []
    for b in (1, 8, 29, 64):
        plain, sp = evaluate(cm, b, 32768), evaluate(cm, b, 32768, spec)
        spec_rows.append(
            f"| {b} | {plain.per_user_tok_s:.0f} | {sp.per_user_tok_s:.0f} | "
            f"{sp.speculative['speedup']:.2f}x | {plain.aggregate_tok_s / sp.aggregate_tok_s:.2f}x |"
        )
    cm_short = layout_for_load(load_hardware("h100"), load_model("llama-3.1-8b"), 1, 512, tp=1)
    short = [
        f"| 8B, 1x H100, 512-token context, batch {b} | {evaluate(cm_short, b, 512, spec).speculative['speedup']:.2f}x |"
        for b in (1, 64, 256, 512)
    ]
    return [
        '## 1. "Up to 2.5x output tok/s at 6x the price" (Anthropic fast mode) via a low-batch lane',
        "",
        "The articles: 65 -> 170 tok/s (2.5x) for 6x the price, same model; the likely mechanism is a smaller batch.",
        "The planner cannot see Opus 4.6, so it asks the reverse question: for a given fast-lane batch, which",
        "standard batch makes each user 2.5x slower, and how much more output does the standard lane sell per",
        "machine-hour (= the price ratio at equal margin)? Decode only, every sequence at the given context.",
        "",
        "| model | devices | context | fast batch | standard batch | per-user tok/s fast / std | speed ratio | price ratio |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        *verdict,
        "",
        "The alternative a reader suggested (an edit to one of the articles reports it), aggressive speculative",
        "decoding (a=0.8, k=4, c=0.05), on the same 70B/8x H100/32k configuration:",
        "",
        "| batch | plain tok/s/user | with speculation | speed-up | cost per token, plain / spec |",
        "|---|---|---|---|---|",
        *spec_rows,
        "",
        "While decode is memory-bound (long contexts) verification is almost free, so speculation *lowers* the",
        "cost per token: on its own it would not justify a 6x price. It only costs more once the verify step",
        "is compute-bound, which takes short contexts and large batches:",
        "",
        "| configuration | speculative speed-up |",
        "|---|---|",
        *short,
        "",
    ]


def claim_spark_speed() -> list[str]:
    wse, h100 = load_hardware("wse-3"), load_hardware("h100")
    rows, ratios = [], []
    for name in ("llama-3.1-8b", "llama-3.1-70b", "gpt-oss-120b", "glm-4.7", "llama-3.1-405b"):
        m = load_model(name)
        fmt = "mxfp4" if name == "gpt-oss-120b" else "bf16"
        cm = layout_for_load(wse, m, 1, 4096, weight_format=fmt)
        sram = evaluate(cm, 1, 4096)
        # A latency-minded GPU lane: at least one full 8-GPU node, more if the weights need it.
        need = layout_for_load(h100, m, 1, 4096, weight_format=fmt).num_devices
        gpu_cm = layout_for_load(h100, m, 1, 4096, tp=max(8, need), weight_format=fmt)
        gpu = evaluate(gpu_cm, 1, 4096)
        ratios.append(sram.per_user_tok_s / gpu.per_user_tok_s)
        rows.append(
            f"| {name} ({fmt}) | {cm.num_devices} | {sram.per_user_tok_s:,.0f} | "
            f"{gpu_cm.num_devices}x H100: {gpu.per_user_tok_s:,.0f} | {sram.per_user_tok_s / gpu.per_user_tok_s:.1f}x |"
        )
    return [
        "## 2. Codex-Spark: 1000+ tok/s, 15x faster, on Cerebras WSE-3",
        "",
        "The articles: 1000+ tok/s against ~65 for GPT-5.3-Codex (15x). Spark's size is not public; the catalog",
        "models bracket the articles' 20-40B guess. Batch 1, 4k context, fewest chips that hold the weights:",
        "",
        "| model | WSE-3 chips | WSE-3 tok/s | H100 batch 1 | ratio |",
        "|---|---|---|---|---|",
        *rows,
        "",
        "**Verdict: reproduces in kind.** Under the fitted latency floor any model up to ~400B decodes at",
        '~1,000 tok/s or more on WSE-3, so "1000+" for a distilled model is expected. The 15x is 1000 / 65:',
        "it compares a batch-1 SRAM machine with a GPU fleet serving at a production batch. Against a batch-1",
        f"GPU lane on a full H100 node the planner's ratio is {min(ratios):.0f}-{max(ratios):.0f}x (last column): the",
        "15x is within that range, and is largest for deep dense models, smallest for sparse ones whose GPU",
        "batch-1 speed is already high.",
        "",
    ]


def claim_sram_capacity() -> list[str]:
    wse = load_hardware("wse-3")
    usable = wse.usable_mem_bytes
    m70 = load_model("llama-3.1-70b")
    kv_32k = m70.kv_bytes(32768)
    return [
        '## 3. "44 GB holds about 20B parameters at fp16 or 40B at int8"',
        "",
        f"Planner: 44 GB x {wse.usable_mem_frac:g} usable = {usable / 1e9:.1f} GB -> "
        f"{usable / 2 / 1e9:.1f}B parameters at 2 bytes, {usable / 1 / 1e9:.1f}B at 1 byte (weights only).",
        f"KV comes out of the same SRAM: one 32k-token sequence of a Llama-70B-shaped model (8 KV heads) takes "
        f"{kv_32k / 1e9:.1f} GB, i.e. {kv_32k / 2 / 1e9:.1f}B fp16 parameters' worth.",
        "",
        "**Verdict: reproduces** for weights alone; with long contexts the model that fits one wafer is smaller,",
        "which is one more reason Spark (like GLM-4.7) is sharded over several wafers, as an edit to one of the",
        "articles says.",
        "",
    ]


def claim_glm_speed() -> list[str]:
    wse = load_hardware("wse-3")
    models = {n: load_model(n) for n in model_names()}
    points = points_from_catalog(calibration_points("wse-3"), models)
    full = fit_sram(wse, points)
    loo = fit_sram(wse, [p for p in points if p.model.name != "glm-4.7"])
    loo_hw = dataclasses.replace(wse, layer_floor_s=loo.layer_floor_s, overhead_s=loo.overhead_s)
    glm = models["glm-4.7"]
    cm = CostModel(wse, glm)  # fewest wafers for the weights, as in the fit
    loo_pred = predict_tok_s(loo_hw, glm, "bf16")
    no_floor = dataclasses.replace(wse, layer_floor_s=0.0, overhead_s=0.0, hop_latency_s=0.0)
    bandwidth_only = predict_tok_s(no_floor, glm, "bf16")
    resid = [f"| {name} | {pub:,.0f} | {pred:,.0f} | {pred / pub - 1:+.0%} |" for name, pub, pred in full.residuals]
    return [
        "## 4. A ~355B MoE (GLM-4.7) at ~1000 tok/s on Cerebras",
        "",
        f"WSE-3's latency floor is fitted to published batch-1 speeds (layer floor {full.layer_floor_s * 1e6:.2f} us,",
        f"overhead {full.overhead_s * 1e6:.0f} us, hop {wse.hop_latency_s * 1e6:.0f} us assumed):",
        "",
        "| model | published tok/s | fitted model | error |",
        "|---|---|---|---|",
        *resid,
        "",
        "GLM-4.7 is one of those points, so predicting it with the full fit is circular. Leaving it out, the",
        f"fit on the other points predicts **{loo_pred:,.0f} tok/s** ({loo_pred / 1000 - 1:+.0%}) for GLM-4.7 at bf16",
        f"on {cm.num_devices} wafers (weights {cm.weight_bytes / 1e9:.0f} GB).",
        "",
        f"**Verdict: reproduces within the fit's scatter (worst point {full.max_abs_rel_error:.0%}).** What the model "
        "says plainly: the speed comes",
        "from a per-layer latency floor times 92 layers plus wafer hops, not from bandwidth (a bytes/bandwidth",
        f"model, the same cost model with floor, overhead and hops set to zero, predicts {bandwidth_only:,.0f} tok/s),",
        "and MoE sparsity does not help an SRAM machine's latency the way it helps a GPU's bytes read.",
        "The 2024 Llama-3.1-8B launch figure (1,800 tok/s) sits furthest from the fit, most likely older software;",
        "a secondary 2026 listing gives ~2,200 tok/s for the same model, which the fit matches within ~20%.",
        "",
    ]


def claim_chain() -> list[str]:
    table = [f"| {r['p_step']:.3f} | {r['p_success'] * 100:.1f}% | {r['source']} |" for r in seed_table(10)]
    results = compare(seed_modes(), 10)
    res = [
        f"| {r.mode} | {r.strategy} | {r.expected_steps:.1f} | {r.expected_time_s:.0f} | {r.expected_cost_usd:.2f} |"
        for r in results
    ]
    return [
        "## 5. The p^n chain: 0.8^10 = 10.7%, 0.9^10 = 34.9%, Spark 2.1-5.6%",
        "",
        "| p per step | p^10 | where p comes from |",
        "|---|---|---|",
        *table,
        "",
        "**Verdict: reproduces exactly.** Note the articles' range 0.68-0.75: 0.68 is 0.9 x 58.4/77.3; 0.75 is",
        "their milder guess, not a scaling of 0.8 (which would give 0.60 and 0.7% over ten steps).",
        "",
        "Expected time and cost to a correct 10-step result, 1,000 output tokens per step, no per-step latency",
        "(`fastmode chain`; Spark's price is assumed equal to standard since none is public):",
        "",
        "| mode | strategy | E[steps] | E[time] s | E[cost] $ |",
        "|---|---|---|---|---|",
        *res,
        "",
        "The articles' point holds only without a verifier: retrying whole pipelines, 15x speed at p=0.68 loses",
        "to fast mode (and even to standard). With a verifier that catches failed steps, Spark's speed wins.",
        "",
    ]


def build() -> str:
    head = [
        "# The fast-mode articles' claims against fastmode's planner",
        "",
        "Two articles compare the fast modes Anthropic and OpenAI shipped in the same week: Anthropic's serves",
        "the same model (Opus 4.6) faster for a higher price, OpenAI's a smaller distilled model",
        '(GPT-5.3-Codex-Spark) on Cerebras wafer-scale chips (the README\'s "Why a fast mode" sums them up).',
        "Each of their quantitative claims is set here beside what the planner predicts.",
        "",
        "Generated by `scripts/seed_claims.py` from the catalogs in `src/fastmode/data/catalog/`; do not edit by",
        "hand. Method and assumptions: `docs/planner.md`. Hardware in the catalog: "
        + ", ".join(hardware_names())
        + ".",
        "",
    ]
    body = claim_low_batch() + claim_spark_speed() + claim_sram_capacity() + claim_glm_speed() + claim_chain()
    return "\n".join(head + body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stdout", action="store_true", help="print instead of writing docs/seed-claims.md")
    args = ap.parse_args()
    text = build()
    if args.stdout:
        print(text)
    else:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        OUT.write_text(text)
        print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
