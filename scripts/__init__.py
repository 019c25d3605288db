"""Developer tools (not shipped): a package so that the tests and mypy import them by name."""
