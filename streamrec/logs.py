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


class RetriedConnections(logging.Filter):
    """kafka-python logs every refused or lost connection at ERROR and then retries it; a
    client that gives up raises, and the command exits 3 with the reason. So an attempt
    that failed is a WARNING: a retry that succeeds leaves no ERROR behind."""

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            record.levelno == logging.ERROR
            and record.name.startswith("kafka.")
            and "KafkaConnectionError" in record.getMessage()
        ):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def setup_logging(level: str | None = None) -> None:
    """Configure the root logger once, from ``level`` or ``STREAMREC_LOG_LEVEL`` (INFO)."""
    level = (level or os.environ.get("STREAMREC_LOG_LEVEL", "INFO")).upper()
    logging.basicConfig(level=level, format=LOG_FORMAT)
    for handler in logging.getLogger().handlers:  # a logger's filter misses its children's
        if not any(isinstance(f, RetriedConnections) for f in handler.filters):
            handler.addFilter(RetriedConnections())
    for name in OWN_LOGGERS:
        logging.getLogger(name).setLevel(level)
    for noisy in ("kafka", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
