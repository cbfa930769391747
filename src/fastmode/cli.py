"""The `fastmode` command line.

Each subcommand lives in the module that owns its concept and exposes
`register(subparsers)`; this file only lists them, so adding a command never
means editing another command's code. Modules are imported lazily so that
`fastmode plan` does not pay for importing torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (subcommand, module that defines `register(subparsers)`)
COMMANDS: list[tuple[str, str]] = [
    ("generate", "fastmode.commands.generate"),
    ("chat", "fastmode.commands.chat"),
    ("plan", "fastmode.planner.command"),
    ("chain", "fastmode.planner.chain_command"),
    ("eval", "fastmode.evals.command"),
    ("serve", "fastmode.commands.serve"),
    ("calibrate", "fastmode.calibrate.command"),
    ("simulate", "fastmode.sim.command"),
    ("distill", "fastmode.distill.command"),
    ("bench", "fastmode.bench.command"),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fastmode", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _, module_name in COMMANDS:
        importlib.import_module(module_name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
