"""`python -m fast_ulysses ...`: the same as the `fast-ulysses` command."""

import sys

from .cli.main import main

if __name__ == "__main__":
    sys.exit(main())
