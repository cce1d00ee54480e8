"""The version of fast-ulysses, in one place: pyproject.toml reads it from here at build time
(scikit-build-core's regex provider), and `fast_ulysses.__version__`, `fast-ulysses --version`
and `fast-ulysses doctor` import it."""

__version__ = "0.1.0"
