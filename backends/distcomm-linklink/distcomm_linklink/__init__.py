"""distcomm's ``linklink`` backend: distcomm on an installed linklink (or spring.linklink)."""

__version__ = "0.1.0"
