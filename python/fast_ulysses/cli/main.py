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
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
