"""The `anydraft` command: one subcommand per module in this package (each has add_parser and run)."""
from __future__ import annotations

import argparse
import importlib
import sys

# Subcommand name -> module; each module defines add_parser(subparsers) and run(args) -> int.
SUBCOMMANDS = ["vocab", "generate", "eval", "bench", "serve", "grow", "advise", "distill"]


class CliError(Exception):
    """A user-facing error: printed as one line, exit code 2, no traceback."""


def build_parser() -> tuple[argparse.ArgumentParser, dict]:
    """The `anydraft` parser and its subcommand modules by name (also read by cli/config_doc.py)."""
    parser = argparse.ArgumentParser(prog="anydraft", description="Lossless speculative decoding with a draft "
                                     "model of any vocabulary.")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name in SUBCOMMANDS:
        try:
            mod = importlib.import_module(f"anydraft.cli.{name}_cmd")
        except ModuleNotFoundError as e:
            if e.name == f"anydraft.cli.{name}_cmd":
                continue  # subcommand not built yet
            raise
        mod.add_parser(sub)
        modules[name] = mod
    return parser, modules


def main(argv: list[str] | None = None) -> int:
    parser, modules = build_parser()
    args = parser.parse_args(argv)
    try:
        return modules[args.command].run(args) or 0
    except (CliError, ValueError, FileNotFoundError, OSError) as e:
        print(f"anydraft {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
