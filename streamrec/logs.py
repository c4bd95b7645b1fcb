"""One log format for every entry point. Only entry points call ``setup_logging``."""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


def setup_logging(level: str | None = None) -> None:
    """Configure the root logger once, from ``level`` or ``STREAMREC_LOG_LEVEL`` (INFO)."""
    logging.basicConfig(
        level=(level or os.environ.get("STREAMREC_LOG_LEVEL", "INFO")).upper(),
        format=LOG_FORMAT,
    )
    for noisy in ("kafka", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
