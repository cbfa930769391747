"""Shared fixtures for the planner tests: catalog entries and a `fastmode`-like parser."""

from __future__ import annotations

import argparse

import pytest

from fastmode.planner.catalog import load_hardware, load_model


@pytest.fixture
def h100():
    return load_hardware("h100")


@pytest.fixture
def llama8b():
    return load_model("llama-3.1-8b")


@pytest.fixture
def cli():
    """Parse and run a planner subcommand exactly as `fastmode` would dispatch it."""
    from fastmode.planner import chain_command, command

    def run(*argv: str) -> int:
        parser = argparse.ArgumentParser(prog="fastmode")
        sub = parser.add_subparsers(dest="command", required=True)
        command.register(sub)
        chain_command.register(sub)
        args = parser.parse_args(list(argv))
        return args.func(args)

    return run
