"""``streamrec``: the operator CLI, one subcommand per thing an operator does.

    streamrec demo [--live]                       the local demo (or a live one with Airflow)
    streamrec produce --config C --synthetic|--live|--file F
    streamrec build-passes --config C             Kafka -> passes, until Ctrl-C
    streamrec cluster --config C [--warm-start P] the PS cluster, until Ctrl-C
    streamrec predict --config C --events F       score events with the serving model
    streamrec serve --config C [--port P]         the online predictor service (HTTP)
    streamrec exporter --config C [--port P]      the pipeline's facts for Prometheus
    streamrec status --config C [--json]          recent passes, flags untrained ones
    streamrec report --config C --out report.html one self-contained HTML page
    streamrec publish --config C --raw-export D   package a raw export as a version
    streamrec deliver --config C --version V      make a published version serve
    streamrec rollback --config C [--version V]   serve an older version again
    streamrec online --config C                   served versions' online metrics; alarm, canary
    streamrec retention --config C [--dry-run]    delete what retention allows
    streamrec schema --config C [--event click]   the JSON Schema producers validate against

Exit codes: 0 ok; 1 failed; 2 bad configuration or arguments; 3 a service (Kafka, Redis,
the cluster) cannot be reached; 4 data breaks its contract; 5 ``status``: a complete pass is
left untrained; 130 stopped by Ctrl-C or SIGTERM. Every subcommand runs in one frame
(``streamrec.entry``) that maps errors to these codes.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Callable
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path

from streamrec.config import EMBEDDED, PipelineConfig, load_config
from streamrec.entry import run_command
from streamrec.errors import ConfigError

ATTENTION = 5


PLUGINS = "streamrec.commands"  # entry points of installed packages: name -> module:main


def plugin_commands() -> dict[str, tuple[str, str]]:
    """Commands other installed packages add (the demo, a composition root above this CLI,
    adds ``streamrec demo``): name -> (their module, the first line of its docstring),
    read without importing it."""
    commands = {}
    for point in entry_points(group=PLUGINS):
        module = point.value.split(":")[0]
        spec = find_spec(module)
        source = Path(spec.origin).read_text() if spec and spec.origin else ""
        doc = ast.get_docstring(ast.parse(source)) or ""
        commands[point.name] = (module, doc.split("\n")[0])
    return commands


def _delegate(module: str) -> Callable[[list[str]], int]:
    """A subcommand that is a stage's own CLI (its ``main(argv)``), imported only when run."""

    def run(argv: list[str]) -> int:
        from importlib import import_module

        return import_module(module).main(argv)

    return run


DELEGATED = {
    "produce": ("streaming.producer", "push events to Kafka: a file, synthetic or live"),
    "build-passes": ("streaming.pass_builder", "cut Kafka topics into passes, until Ctrl-C"),
    "cluster": ("ops.cluster_command", "run the parameter-server cluster, until Ctrl-C"),
    "predict": ("serving_export.predictor", "score a file of events with the serving model"),
    "serve": ("serving_export.serve_command", "the online predictor service (HTTP), until Ctrl-C"),
    "exporter": ("ops.exporter", "the pipeline's per-pass facts on /metrics, until Ctrl-C"),
}


def _config(path: Path) -> PipelineConfig:
    cfg = load_config(path)
    if cfg.redis.url == EMBEDDED:
        raise ConfigError(f"{path}: redis.url is 'embedded': give the running Redis's address")
    return cfg


def _status(args: argparse.Namespace) -> int:
    from ops.status import (
        cluster_summary,
        format_cluster,
        format_leftovers,
        format_serving,
        format_table,
        leftover_summary,
        needs_attention,
        recent_passes,
        serving_summary,
    )

    cfg = _config(args.config)
    rows = recent_passes(cfg, args.limit)
    serving = serving_summary(cfg)
    cluster = cluster_summary(cfg)
    left = leftover_summary(cfg)
    if args.json:
        passes = [r.to_dict() for r in rows]
        whole = {"serving": serving, "cluster": cluster, "leftovers": left, "passes": passes}
        print(json.dumps(whole, indent=2))
    else:
        parts = [format_table(rows), format_serving(serving), format_cluster(cluster)]
        print("\n\n".join([*parts, format_leftovers(left)]))
    return ATTENTION if needs_attention(rows) else 0


def _report(args: argparse.Namespace) -> int:
    from ops.online import online_of
    from ops.report import render
    from ops.status import (
        cluster_summary,
        format_cluster,
        format_serving,
        format_table,
        recent_passes,
        serving_summary,
        stale_after_seconds,
    )
    from streamrec.atomic_fs import write_text_atomic

    cfg = _config(args.config)
    rows = recent_passes(cfg, args.limit)
    online = online_of(cfg)  # read once: the status text and the chart
    serving = serving_summary(cfg, online=online)
    status = [format_table(rows), format_serving(serving), format_cluster(cluster_summary(cfg))]
    target = stale_after_seconds(cfg.passes.clock)  # the freshness plot's target line
    page = render(cfg.name, rows, "\n\n".join(status), target, online=online)
    write_text_atomic(args.out.resolve(), page)
    print(f"wrote {args.out} ({len(rows)} passes)")
    return 0


def _deliver(args: argparse.Namespace) -> int:
    from serving_export.delivery import deliver, registry_for

    cfg = _config(args.config)
    result = deliver(cfg, args.version)
    registry = registry_for(cfg)
    serving = registry.serving_version()
    print(json.dumps({**result.to_wire(), "serving": serving}))
    if (withdrawn := registry.withdrawn().get(args.version)) is not None:
        print(f"error: {args.version} was withdrawn: {withdrawn.reason}", file=sys.stderr)
        return 1
    if result.candidate or registry.candidate() == args.version:
        return 0  # on canary: `streamrec online` promotes or withdraws it
    if serving != args.version:
        print(
            f"error: {serving} is newer and serves; use 'streamrec rollback' to go back",
            file=sys.stderr,
        )
        return 1
    return 0


def _publish(args: argparse.Namespace) -> int:
    from serving_export.delivery import publish, stored_decision
    from trainers.export_spec import read_export_spec

    cfg = _config(args.config)
    spec = read_export_spec(args.raw_export)
    manifest = publish(cfg, args.raw_export, stored_decision(cfg, spec.pass_id))
    print(json.dumps({"version": manifest.version, "sparse": manifest.sparse.model_dump()}))
    return 0


def _rollback(args: argparse.Namespace) -> int:
    from serving_export.delivery import registry_for, rollback

    cfg = _config(args.config)
    registry = registry_for(cfg)
    version = args.version
    if version is None:
        serving = registry.serving_version()
        older = [v for v in registry.versions() if serving is not None and v < serving]
        if not older:
            print(
                f"error: no registered version older than the serving one ({serving})",
                file=sys.stderr,
            )
            return 1
        version = older[-1]
    previous, switched = rollback(cfg, version)
    print(json.dumps({"version": version, "previous": previous, "switched": switched}))
    return 0


def _online(args: argparse.Namespace) -> int:
    from ops.online import judge_online

    result = judge_online(_config(args.config))
    print(json.dumps(result.to_dict(), indent=2 if args.pretty else None))
    return 0


def _retention(args: argparse.Namespace) -> int:
    from ops.retention import apply

    result = apply(_config(args.config), dry_run=args.dry_run)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    verb = "would delete" if result.dry_run else "deleted"
    for d in result.deletions:
        print(f"{verb} {d.kind:<10} {d.target}  ({d.reason})")
    print(f"{verb}: {result.counts() or 'nothing'}")
    return 0


def _schema(args: argparse.Namespace) -> int:
    from streaming.event_contract import pipeline_schemas
    from trainers.network_loader import check_network_fits, importable_here

    cfg = load_config(args.config)  # no service is needed: embedded addresses are fine
    importable_here()
    check_network_fits(cfg.feature_schema, cfg.model)  # a schema its network cannot read
    schemas = pipeline_schemas(cfg)
    if args.event not in schemas:
        raise ConfigError(
            f"{args.config}: the pipeline reads no {args.event} events (it reads: "
            f"{', '.join(schemas)}; a label joined from its own topic is listed in "
            "schema.labels with source: topic)"
        )
    print(json.dumps(schemas[args.event], indent=2))
    return 0


def parser() -> argparse.ArgumentParser:
    """The ``streamrec`` parser: its own subcommands, and the delegated ones by name."""
    parser = argparse.ArgumentParser(
        prog="streamrec", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_) in (plugin_commands() | DELEGATED).items():
        sub.add_parser(name, help=help_, add_help=False)

    def command(name: str, help_: str, run: Callable[[argparse.Namespace], int]):
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("--config", required=True, type=Path, help="pipeline YAML")
        p.set_defaults(run=run)
        return p

    p = command("status", "recent passes: data, metrics, saves, delivery, freshness", _status)
    p.add_argument("--limit", type=int, default=20, help="passes shown (newest)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = command("report", "write one self-contained HTML page with plots", _report)
    p.add_argument("--out", type=Path, default=Path("streamrec-report.html"), help="HTML file")
    p.add_argument("--limit", type=int, default=200, help="passes plotted (newest)")
    p = command("publish", "package a raw export the gate passed as a version", _publish)
    p.add_argument("--raw-export", required=True, type=Path, help="the cluster's export dir")
    p = command("deliver", "make a published version the serving one (forward only)", _deliver)
    p.add_argument("--version", required=True, help="version (pass id) to serve")
    p = command("rollback", "serve an older registered version again", _rollback)
    p.add_argument("--version", help="version to serve (default: the one before the serving)")
    p = command(
        "online",
        "each served version's online metrics; with online.rollback, roll a worse one back",
        _online,
    )
    p.add_argument("--pretty", action="store_true", help="indented JSON")
    p = command("retention", "delete old passes, slices, saves, artifacts, Redis keys", _retention)
    p.add_argument("--dry-run", action="store_true", help="list what would go; delete nothing")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = command("schema", "print the JSON Schema of the events this pipeline reads", _schema)
    p.add_argument(
        "--event",
        default="impression",
        help="which event: impression, or a label joined from its own topic (click, ...)",
    )
    return parser


def command_parsers() -> dict[str, argparse.ArgumentParser]:
    """``streamrec`` and each subcommand's parser, by command name: the CLI reference is
    generated from them (a delegated command's module exposes ``parser()``)."""
    from importlib import import_module

    top = parser()
    subcommands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    delegated = plugin_commands() | DELEGATED
    own = {name: p for name, p in subcommands.choices.items() if name not in delegated}
    theirs = {name: import_module(module).parser() for name, (module, _) in delegated.items()}
    return {"streamrec": top, **dict(sorted({**own, **theirs}.items()))}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return _delegate(DELEGATED[argv[0]][0])(argv[1:])
    if argv and (plugin := plugin_commands().get(argv[0])):
        return _delegate(plugin[0])(argv[1:])
    args = parser().parse_args(argv)
    return run_command(lambda: args.run(args))


if __name__ == "__main__":
    sys.exit(main())
