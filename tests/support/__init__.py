"""What test tiers share (fixtures and helpers), registered once through ``pytest_plugins`` in
``tests/conftest.py``; a test module never imports another ``test_*`` module (checked by
tests/unit/test_test_layout.py): what two test modules share lives here."""
