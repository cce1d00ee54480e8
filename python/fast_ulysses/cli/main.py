"""`fast-ulysses` command line: plan (GPU-free), doctor, bench."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__
    from ..bench import command as bench
    from . import doctor, plan_cmd
    from ._help import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="fast-ulysses", description=__doc__, formatter_class=HelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"fast-ulysses {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for module in (plan_cmd, doctor, bench):
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # `fast-ulysses doctor --bogus`: the command's usage, not the top-level one
        command = _subcommands(parser)[args.command]
        command.error(f"unrecognized arguments: {' '.join(extra)}")  # exits 2
    return args.run(args)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand, by name."""
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices


if __name__ == "__main__":
    sys.exit(main())
