"""Benchmarks behind ``eloquent bench NAME``; each module exposes ``add_arguments(parser)`` and ``run(args)``."""
