"""``streamrec serve``: the predictor service (``http_app``) on uvicorn, following the
registry of the pipeline's Redis, with the sparse store, runtime, address and served log
its config and options give."""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from pathlib import Path

from serving_export.http_app import create_app
from serving_export.served_log import ServedLog
from serving_export.shutdown import StopClock
from streamrec.config import EMBEDDED, derived, load_config
from streamrec.entry import run_command
from streamrec.errors import ConfigError, ServiceError
from streamrec.redis_conn import require_credentials

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    """The command's arguments."""
    parser = argparse.ArgumentParser(
        prog="streamrec serve",
        description="Serve the registry's model over HTTP, following deliveries and rollbacks.",
    )
    parser.add_argument("--config", required=True, type=Path, help="pipeline YAML (real Redis)")
    parser.add_argument("--host", help="listen address (default: serving.host)")
    parser.add_argument("--port", type=int, help="listen port (default: serving.port)")
    parser.add_argument(
        "--sparse-store", choices=["inprocess", "redis"], help="default: serving.sparse_store"
    )
    parser.add_argument(
        "--runtime", choices=["paddle", "onnx"], help="dense program runner (serving.runtime)"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """``streamrec serve``: serve until Ctrl-C or SIGTERM (exit 130)."""
    args = parser().parse_args(argv)
    return run_command(lambda: _serve(args))


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from serving_export.delivery import registry_for, sparse_store_for

    cfg = load_config(args.config)
    if cfg.redis.url == EMBEDDED:
        raise ConfigError(
            f"{args.config}: redis.url is 'embedded': give the Redis the pipeline delivers to"
        )
    overrides = {"sparse_store": args.sparse_store, "runtime": args.runtime, "host": args.host}
    given = {k: v for k, v in overrides.items() if v is not None}
    cfg = derived(cfg, f"{args.config} with the command's options", serving=given)
    try:  # refused credentials stop the service now, not on every poll
        require_credentials(cfg.redis)
    except ServiceError as e:  # a Redis not up yet: the version follower keeps trying
        log.warning("%s; serving starts and retries", e)
    host = cfg.serving.host
    port = cfg.serving.port if args.port is None else args.port
    replica = f"{socket.gethostname()}:{port}"
    served_log = None
    if (topic := cfg.serving.log_topic) is not None:
        if cfg.kafka.bootstrap_servers == EMBEDDED:
            raise ConfigError(
                f"{args.config}: serving.log_topic needs a Kafka: set kafka.bootstrap_servers"
            )
        served_log = ServedLog.to_kafka(cfg.kafka, topic, cfg.serving.log_buffer_events)
    clock = StopClock(cfg.serving.shutdown_grace_seconds, watchdog=True)
    app = create_app(
        cfg.serving, registry_for(cfg), sparse_store_for(cfg), replica, served_log, clock
    )
    log.info(
        "streamrec serve on %s:%d: model %s, %s sparse store",
        host,
        port,
        cfg.model.model,
        cfg.serving.sparse_store,
    )
    # no proxy-header rewriting: nothing here reads the client's address
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        proxy_headers=False,
        timeout_graceful_shutdown=cfg.serving.shutdown_grace_seconds,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    clock.stopping = lambda: server.should_exit
    server.run()  # a signal's stop ends in KeyboardInterrupt: exit 130 (streamrec.entry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
