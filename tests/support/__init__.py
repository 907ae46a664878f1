"""Helpers shared by tests: real-engine fixtures and generated artifacts (no model hub on CI machines)."""
