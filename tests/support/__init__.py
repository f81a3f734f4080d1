"""Helpers the tiers share, registered as pytest plugins in tests/conftest.py (``pytest_plugins``)."""
