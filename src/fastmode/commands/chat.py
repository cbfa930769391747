"""`fastmode chat`: an interactive conversation in the terminal."""

from __future__ import annotations

import argparse
import sys

from fastmode.commands.common import add_model_args, add_sampling_args, load_llm_and_params


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="interactive chat (empty line or Ctrl-D quits)")
    p.add_argument("--system", default=None, help="system prompt")
    add_model_args(p)
    add_sampling_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    loaded = load_llm_and_params(args)
    if loaded is None:
        return 2
    llm, params = loaded
    messages = [{"role": "system", "content": args.system}] if args.system else []
    print(f"fastmode chat with {llm.engine.model_name} ({args.tier} tier). Empty line quits.", file=sys.stderr)
    while True:
        try:
            user = input("> ")
        except EOFError:
            break
        if not user.strip():
            break
        messages.append({"role": "user", "content": user})
        ids = llm.tokenizer.encode_chat(messages)
        reply = ""
        for out in llm.stream(ids, params, args.tier):
            sys.stdout.write(out.delta_text)
            sys.stdout.flush()
            reply = out.text
        print()
        messages.append({"role": "assistant", "content": reply})
    return 0
