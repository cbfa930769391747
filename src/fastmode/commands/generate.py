"""`fastmode generate "prompt"`: stream a completion to stdout."""

from __future__ import annotations

import argparse
import sys
import time

from fastmode.commands.common import add_model_args, add_sampling_args, load_llm_and_params


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="complete a prompt (chat-templated unless --raw)")
    p.add_argument("prompt")
    p.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    add_model_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_llm_and_params(args)
    if loaded is None:
        return 2
    llm, params = loaded
    tok = llm.tokenizer
    prompt = (
        args.prompt
        if args.raw or not tok.chat_template
        else tok.encode_chat([{"role": "user", "content": args.prompt}])
    )
    t0 = time.perf_counter()
    last = None
    for out in llm.stream(prompt, params, args.tier):
        sys.stdout.write(out.delta_text)
        sys.stdout.flush()
        last = out
    elapsed = time.perf_counter() - t0
    n = len(last.token_ids) if last else 0
    m = last.metrics if last else None
    ttft = f"{m.ttft_s * 1000:.0f} ms" if m and m.ttft_s is not None else "-"
    print(
        f"\n\n[{llm.engine.model_name} | {str(llm.engine.loaded.dtype).removeprefix('torch.')} | {n} tokens in {elapsed:.2f} s, "
        f"{n / elapsed:.1f} tok/s | TTFT {ttft} | finish: {last.finish_reason if last else '-'}]",
        file=sys.stderr,
    )
    return 0
