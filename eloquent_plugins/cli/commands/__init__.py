"""Subcommands of the ``eloquent`` console script; each module exposes ``register(subparsers)``."""
