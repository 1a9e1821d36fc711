"""What several test modules share, by subject; a test module imports from here (or a conftest), never from
another test module (`tests/test_dependencies.py` holds that rule)."""
