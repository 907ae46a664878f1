"""The ``eloquent`` command (``main.py``): the top of the house, which composes every other part -- the served app
(``app_factory.py``), the subcommands (``commands/``), the in-process harness they share (``harness.py``) and the
benchmarks (``bench/``). Nothing outside ``cli/`` imports it."""
