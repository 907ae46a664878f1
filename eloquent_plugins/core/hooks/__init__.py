"""The plugin hooks (pluggy, the one third-party library core uses): the hook specs (``specs.py``), the plugin
manager that loads the ``eloquent_plugins`` entry points and checks once per stream whether any plugin wants
per-event calls (``manager.py``), and the built-in codecs registered like any plugin (``builtin.py``)."""
