"""The behavioural suite, one module per section (see helpers.py)."""
