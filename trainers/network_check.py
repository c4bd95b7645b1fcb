"""The network a config names, built once before the cluster starts: a network that cannot
be imported, declares a bad hyper-parameter or returns the wrong shape fails the start with
exit 2 naming the key, instead of every worker failing at its own start, restarted in a loop.
A warm start (``trainers.warm_start``) that does not fit the built model fails it the same
way. A shipped network without a warm start is checked in this process: only its
hyper-parameters' values can be wrong.

The build runs in a child process (``python -m trainers.network_check``): it imports paddle
and the user's module, which the caller (a CLI, the demo, a test) need not.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from streamrec.config import load_config
from streamrec.errors import ConfigError
from trainers.network_loader import (
    SHIPPED_NETWORKS,
    check_network_fits,
    importable_here,
    network_factory,
    network_params,
    network_path,
)


def check_network(config_path: Path, timeout_s: float = 300) -> None:
    """Build the network of the config at ``config_path`` in a scratch program; ConfigError
    with the child's message when it cannot be built. The folder this process started in
    goes on PYTHONPATH for the cluster's processes, which start elsewhere."""
    importable_here()
    cfg = load_config(config_path)
    check_network_fits(cfg.feature_schema, cfg.model)
    if network_path(cfg.model) in SHIPPED_NETWORKS.values() and cfg.checkpoints.warm_start is None:
        # a shipped network's graph is built by the unit tests: only the YAML's values for
        # it can be wrong, and pydantic checks those without paddle (4-8 s saved a start)
        network_params(cfg.model, network_factory(cfg.model))
        return
    done = subprocess.run(
        [sys.executable, "-m", "trainers.network_check", "--config", str(config_path)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode == 0:
        return
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    if done.returncode == ConfigError.exit_code and lines:
        raise ConfigError(lines[-1])
    raise ConfigError(
        f"{config_path}: the network could not be built (exit {done.returncode}): "
        + " | ".join(lines[-5:])
    )


def _build(config_path: Path) -> None:
    import paddle

    from trainers.models import build_model
    from trainers.warm_start import check_warm_start, model_signature

    cfg = load_config(config_path)
    paddle.enable_static()
    main = paddle.static.Program()
    with paddle.static.program_guard(main, paddle.static.Program()):
        build_model(cfg.feature_schema, cfg.model)
    check_warm_start(cfg, model_signature(cfg, main))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a config's network once; exit 2 if not.")
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        _build(args.config)
    except ConfigError as e:
        print(str(e).replace("\n", " "), file=sys.stderr)
        return ConfigError.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
