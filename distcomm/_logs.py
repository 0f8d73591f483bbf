"""The ``distcomm`` logger and ``DISTCOMM_LOG_LEVEL``.

distcomm logs to the logger named ``"distcomm"`` and never configures logging at import. When
``DISTCOMM_LOG_LEVEL`` is set, the first call that loads plugins (``init``, ``distcomm info``,
``detect_environment``) sets that level and, if the logger has no handler yet, adds one that
writes to stderr with the process id, so that the messages appear without any set-up.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from distcomm import _settings

__all__ = ["configure_from_env", "logger"]

logger = logging.getLogger("distcomm")


def configure_from_env(environ: Mapping[str, str]) -> None:
    """Apply ``DISTCOMM_LOG_LEVEL`` from ``environ`` (no-op when unset).

    Raises:
        InvalidArgumentError: the value is not a logging level name.
    """
    level = _settings.read("DISTCOMM_LOG_LEVEL", environ)
    if level is None:
        return
    logger.setLevel(level)
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[distcomm %(process)d] %(levelname)s %(message)s"))
        logger.addHandler(handler)
