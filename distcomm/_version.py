"""The version of distcomm, in one place (setuptools reads it from here)."""

__version__ = "0.1.0"
"""The version of the installed distcomm, e.g. ``"0.1.0"`` (``distcomm info`` shows it too)."""
