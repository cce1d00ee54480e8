"""`python -m fast_ulysses.bench` (under torchrun too): the same as `fast-ulysses bench`."""

import sys

from .command import main

sys.exit(main())
