"""The version of distcomm, in one place (setuptools reads it from here)."""

__version__ = "0.1.0"
