"""Headless Chromium over the DevTools protocol: the package's driver (``eloquent bench e2e --browser`` uses it)."""

from eloquent_plugins.cli.bench.chromium import Chromium, DevToolsError, Page, chromium_executable

__all__ = ["Chromium", "DevToolsError", "Page", "chromium_executable"]
