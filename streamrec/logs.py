"""One log format for every entry point. Only entry points call ``setup_logging``."""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
# importing paddle sets the root logger to WARNING; our loggers keep their own level
OWN_LOGGERS = (
    "streamrec",
    "streaming",
    "trainers",
    "serving_export",
    "ops",
    "demo",
    "dags",
    "uvicorn",
)


def setup_logging(level: str | None = None) -> None:
    """Configure the root logger once, from ``level`` or ``STREAMREC_LOG_LEVEL`` (INFO)."""
    level = (level or os.environ.get("STREAMREC_LOG_LEVEL", "INFO")).upper()
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for noisy in ("kafka", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
