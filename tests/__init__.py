"""Test modules; a package so that pytest imports them by their dotted path (tests.<folder>.<module>)."""
