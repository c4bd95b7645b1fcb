"""Training throughput of the streamrec cluster against Paddle's documented PS example, and
the servers' memory with and without eviction.

1. Two synthetic passes (``--rows`` each) go through the real broker and pass builder. Our
   cluster (1 server + 2 workers, Redis control plane, progressive metrics, checkpoint)
   trains the first in each mode of ``MODES`` (async with separate, sampled or in-train
   progressive metrics, sync), a fresh cluster each, and the second after the first in the
   shipped mode; the reference
   (bench/reference_trainer.py: plain TSV files, a MultiSlotDataGenerator pipe reader,
   ``train_from_dataset``; same model, strategy, batch size, servers and workers) trains
   the same rows once, without metrics or a save. The training phase and our whole
   command (progressive metrics + training + checkpoint + control plane) against the
   reference's training alone.
2. ``--memory-passes`` passes of a heavy-tail stream (one-off user ids), four passes a
   logical day with the daily maintenance, trained with eviction off and on; the servers'
   peak RSS (VmHWM) and the table's key count for each.
3. ``--error-passes`` passes trained in ``progressive: sample`` mode, each scored whole
   by the same cluster just before: the sample's metrics against the whole pass's.

    .venv/bin/python bench/train.py [--rows 200000] [--threads 1] [--error-passes 6]
                                    [--memory-passes 20] [--memory-events 100000]
                                    [--set KEY=VALUE ...] [--shipped-only]

``--set`` changes a config key of the timed pass's runs, on both sides (for example
``model.runner.batch_size=64``). ``--shipped-only`` times the shipped mode and the reference
alone (no other modes, no GEO pair): a sweep's run in minutes, with the first three
RESULT lines only.

Ends with ``RESULT train_ratio`` (training phase, default mode, rows/s ours / reference),
``train_command_ratio`` (the whole command in the shipped mode, against the reference's
training), ``pass_critical_path_s`` (what the pass adds to the critical path beyond its
training: the shipped mode's command outside its training phase, as nothing of a pass runs
beside another's training yet: conversion, scores, refit, save, control plane; it was
``pass_fixed_seconds``) on a pass after another, as a running pipeline's cluster trains
it, and ``pass_critical_path_first_s`` on the first pass of a fresh cluster (Arrow's and
Paddle's first calls in its processes), ``train_command_ratio_<mode>`` for
separate, sample and in_train,
``progressive_sample_<metric>_error_max`` for AUC, logloss and COPC,
``sync_over_async`` (training phase rows/s, both with sampled progressive metrics),
``geo_over_async`` (bench/geo_trainer.py's bucketed model in both modes)
and the two peak RSS figures.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
from machine import hardware_line
from pipeline import REPO, bench_config, build, fleet_job, tsv_line, with_settings

from devservices.local_services import local_services
from streamrec.auc import exact_auc
from streamrec.config import PipelineConfig, derived, dump_config, load_config
from streamrec.contracts.training import ScoreReply
from streamrec.passes import pass_dir, read_manifest
from trainers.launcher import LocalCluster


def _tsv_files(cfg: PipelineConfig, pass_id: str, out: Path) -> list[str]:
    """The pass's rows as the reference reader's TSV, one file per Parquet part."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    files = []
    for part in read_manifest(directory).parts:
        rows = pq.read_table(directory / part.file).to_pylist()
        path = out / (Path(part.file).stem + ".tsv")
        with open(path, "w") as f:
            f.writelines(tsv_line(cfg.feature_schema, r) for r in rows)
        files.append(str(path))
    return files


def _reference(
    cfg: PipelineConfig,
    files: list[str],
    work: Path,
    script: str = "reference_trainer.py",
    *extra: str,
) -> float:
    """Seconds of ``bench/<script>``'s ``train_from_dataset`` on ``files`` (slowest worker),
    ``extra`` passed on to it."""
    reports = fleet_job(cfg, work, script, "--files", ",".join(files), *extra)
    return max(r["seconds"] for r in reports)


def _server_memory_mib(cluster: LocalCluster, field: str) -> float:
    """Sum over the server processes of a /proc status field (VmRSS now, VmHWM peak)."""
    total = 0.0
    for proc in cluster.members("PSERVER"):
        status = Path(f"/proc/{proc.pid}/status").read_text().splitlines()
        total += next(int(line.split()[1]) for line in status if line.startswith(field))
    return total / 1024


REPEATS = 2
# (label, runner settings): every progressive setting in async, then sync
MODES = [
    ("async, separate", {"sync_mode": "async", "progressive": "separate"}),
    ("async, sample", {"sync_mode": "async", "progressive": "sample"}),
    ("async, in_train", {"sync_mode": "async", "progressive": "in_train"}),
    ("sync, sample", {"sync_mode": "sync", "progressive": "sample"}),
]


@dataclass
class ModeRun:
    label: str
    train_s: float  # the training phase, slowest worker
    command_s: float  # submit to result: metrics + training + save + control plane
    auc: float  # the pass's progressive AUC as the mode measures it
    stages: dict[str, float]  # worker 0's seconds per stage of the command


def _train_once(
    cfg: PipelineConfig,
    pass_id: str,
    label: str,
    settings: dict,
    attempt: int,
    after: str | None = None,
) -> ModeRun:
    """A fresh cluster in the ``settings`` mode trains the pass, as the reference does; with
    ``after``, it trains that pass first, untimed, as a running pipeline's cluster has."""
    slug = f"{re.sub('[^a-z0-9]+', '-', label)}-{attempt}"
    run = Path(cfg.paths.work_root).parent / slug
    cfg = derived(
        cfg,
        f"the {label} run's config",
        name=f"throughput-{slug}",
        model={"runner": settings},
        paths={"checkpoint_root": run / "checkpoints", "work_root": run / "run"},
    )
    resolved = dump_config(cfg, run / "pipeline.yaml")
    with LocalCluster(cfg, resolved) as cluster:
        if after:
            cluster.client.train(after)
        start = time.perf_counter()
        result = cluster.client.train(pass_id)
        command = time.perf_counter() - start
    return ModeRun(label, result.seconds["train"], command, result.test.auc, result.seconds)


def throughput(
    services,
    root: Path,
    rows: int,
    threads: int,
    settings: list[str],
    modes: list[tuple[str, dict]],
    shipped: str,
) -> tuple[list[ModeRun], ModeRun, float, dict[str, float]]:
    """Each of ``modes``' runs on the same pass, the ``shipped`` mode's on the next pass
    after that one (a warm cluster), and the reference's training seconds on the first
    (``settings``: config keys changed on both sides, ``KEY=VALUE``); the GEO pair only
    when every mode runs."""
    cfg = bench_config(services, root, "throughput", rows)
    cfg = derived(cfg, "the throughput config", model={"runner": {"thread_num": threads}})
    cfg = with_settings(cfg, settings)
    first, second = build(cfg, 2)
    n = read_manifest(pass_dir(cfg.paths.data_root, first)).rows
    runs = []
    for label, settings in modes:
        if settings["sync_mode"] == "sync" and threads > 1:
            settings = {**settings, "thread_num": 1}  # one batch per round
            label = f"{label}, 1 thread"
        # the faster of REPEATS runs, on both sides: one run on 2 shared cores varied ~25%
        tries = [_train_once(cfg, first, label, settings, i) for i in range(REPEATS)]
        runs.append(min(tries, key=lambda r: r.command_s))
        print(f"  {label}: pass trained in {[round(t.command_s, 2) for t in tries]}s", flush=True)
    label, settings = next(m for m in modes if m[0] == shipped)
    warm = min(
        (_train_once(cfg, second, label, settings, i, after=first) for i in range(REPEATS)),
        key=lambda r: r.command_s,
    )
    tsv = root / "tsv"
    tsv.mkdir()
    files = _tsv_files(cfg, first, tsv)
    reference = min(
        _reference(cfg, files, root / "throughput" / f"run-{i}") for i in range(REPEATS)
    )
    geo = {
        mode: min(
            _reference(cfg, files, root / f"bucketed-{mode}-{i}", "geo_trainer.py", "--mode", mode)
            for i in range(REPEATS)
        )
        for mode in (("async", "geo") if modes == MODES else ())
    }
    print(
        f"pass of {n:,} rows, {cfg.cluster.servers} server(s), {cfg.cluster.workers} workers,"
        f" {threads} reader thread(s) each, a fresh cluster per run"
    )
    print(f"  {'':<36} {'train phase':>11} {'command':>9} {'command rows/s':>15} {'AUC':>6}")
    for r in runs:
        print(
            f"  streamrec {r.label:<26} {r.train_s:10.2f}s {r.command_s:8.2f}s"
            f" {n / r.command_s:>15,.0f} {r.auc:6.3f}"
        )
    print("  where each command's time goes (worker 0, seconds per stage):")
    for r in runs:
        stages = ", ".join(f"{k} {v:.2f}" for k, v in r.stages.items())
        rest = r.command_s - sum(r.stages.values())
        print(f"    {r.label:<26} {stages}; outside the stages {rest:.2f}")
    stages = ", ".join(f"{k} {v:.2f}" for k, v in warm.stages.items())
    rest = warm.command_s - sum(warm.stages.values())
    print(
        f"  the next pass, after one (a warm cluster), {warm.label}: train phase"
        f" {warm.train_s:.2f}s, command {warm.command_s:.2f}s\n    {stages};"
        f" outside the stages {rest:.2f}"
    )
    ref = f"{reference:10.2f}s {'':>9} {n / reference:>15,.0f}"
    print(f"  reference train_from_dataset (TSV) {ref}")
    if geo:
        print("  the model with each slot's signs in 2^18 buckets (the only embedding GEO takes):")
    for mode, seconds in geo.items():
        print(f"    {mode:<5} train_from_dataset {seconds:10.2f}s {'':>9} {n / seconds:>15,.0f}")
    return runs, warm, reference, geo


def _full_pass_metrics(
    cfg: PipelineConfig, pass_id: str, scored: list[ScoreReply]
) -> dict[str, float]:
    """AUC, logloss and COPC of the cluster's predictions for every row of the pass."""
    directory = pass_dir(cfg.paths.data_root, pass_id)
    labels = {}
    for part in read_manifest(directory).parts:
        table = pq.read_table(directory / part.file, columns=["event_id", "label"]).to_pydict()
        labels.update(zip(table["event_id"], table["label"], strict=True))
    ids, p = [], []
    for worker in scored:
        table = pq.read_table(worker.predictions).to_pydict()
        ids += table["event_id"]
        p += table["p_click"]
    y = np.array([labels[i] for i in ids], dtype=float)
    q = np.clip(np.array(p, dtype=float), 1e-7, 1 - 1e-7)
    return {
        "count": len(ids),
        "auc": exact_auc(q, y),
        "logloss": float(-np.mean(y * np.log(q) + (1 - y) * np.log(1 - q))),
        "copc": float(y.sum() / q.sum()),
    }


def progressive_error(services, root: Path, rows: int, passes: int) -> list[dict]:
    """The ``sample`` mode's progressive metrics against the whole pass's, on the same model:
    before each pass is trained (in ``sample`` mode), the cluster scores all of it."""
    cfg = bench_config(services, root, "progressive", rows)
    cfg = derived(cfg, "the progressive config", model={"runner": {"progressive": "sample"}})
    runner = cfg.model.runner
    ids = build(cfg, passes)
    resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
    compared = []
    with LocalCluster(cfg, resolved) as cluster:
        for i, pass_id in enumerate(ids):
            full = _full_pass_metrics(cfg, pass_id, cluster.client.score(pass_id)) if i else None
            result = cluster.client.train(pass_id)
            if full is not None:  # a fresh model's first pass says nothing
                compared.append({"pass": pass_id, "full": full, "sample": result.test.to_dict()})
    print(
        f"progressive metrics of {passes - 1} passes of {rows:,} rows: every "
        f"{math.ceil(rows / runner.progressive_rows)}th row (progressive_rows "
        f"{runner.progressive_rows:,}) against all of them, the same model"
    )
    print(
        f"  {'pass':<14}{'rows':>8}{'AUC':>8}{'sample':>8}{'logloss':>9}{'sample':>8}"
        f"{'COPC':>7}{'sample':>8}"
    )
    for c in compared:
        f, m = c["full"], c["sample"]
        print(
            f"  {c['pass']:<14}{m['count']:>8}{f['auc']:8.4f}{m['auc']:8.4f}"
            f"{f['logloss']:9.4f}{m['logloss']:8.4f}{f['copc']:7.3f}{m['copc']:8.3f}"
        )
    return compared


def memory(services, root: Path, passes: int, events: int) -> dict[str, tuple[float, float, int]]:
    """Servers' RSS at start and peak (MiB) and the final table keys, eviction off and on."""
    heavy = {"cardinality": {"user_id": 20_000_000, "item_id": 200_000}}
    base = bench_config(services, root, "memory", events, **heavy)
    base = derived(base, "the memory config", passes={"pass_seconds": 21600})  # 4 a logical day
    ids = build(base, passes)
    figures = {}
    for label, table in (
        ("off", {}),
        ("on", {"delete_threshold": 0.25, "delete_after_unseen_days": 1}),
    ):
        cfg = derived(
            base,
            f"the memory config, eviction {label}",
            name=f"memory-{label}",
            model={"hyper_parameters": {"sparse_table": table}},
            paths={"checkpoint_root": root / f"ckpt-{label}", "work_root": root / f"run-{label}"},
        )
        resolved = dump_config(cfg, Path(cfg.paths.work_root) / "pipeline.yaml")
        keys = 0
        with LocalCluster(cfg, resolved) as cluster:
            start = _server_memory_mib(cluster, "VmRSS")
            for i, pass_id in enumerate(ids, 1):
                keys = cluster.client.train(pass_id).checkpoint.table_keys
                if cfg.passes.clock.closes_day(pass_id):
                    daily = cluster.client.maintain(pass_id).checkpoint
                    keys = daily.table_keys if daily is not None else keys
                print(
                    f"\r  eviction {label}: pass {i}/{len(ids)}, {keys:,} keys", end="", flush=True
                )
            peak = _server_memory_mib(cluster, "VmHWM")
        print()
        figures[label] = (start, peak, keys)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=200_000, help="rows of the timed pass")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="reader threads per worker on both sides (more than 1: metrics from dumps)",
    )
    parser.add_argument(
        "--memory-passes", type=int, default=20, help="passes of the RSS run (0: skip it)"
    )
    parser.add_argument(
        "--error-passes",
        type=int,
        default=6,
        help="passes of the progressive: sample error run (0: skip it)",
    )
    parser.add_argument(
        "--memory-events", type=int, default=100_000, help="events per pass of the RSS run"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config key of the timed pass's runs to change (both sides), e.g. "
        "model.runner.batch_size=512",
    )
    parser.add_argument(
        "--shipped-only",
        action="store_true",
        help="time the shipped mode and the reference only",
    )
    args = parser.parse_args()
    shipped = load_config(REPO / "configs" / "pipeline.yaml").model.runner
    shipped_label = f"{shipped.sync_mode}, {shipped.progressive}"
    modes = [m for m in MODES if m[0] == shipped_label] if args.shipped_only else MODES
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        with local_services(root / "services") as services:
            print(f"hardware: {hardware_line()}")
            compared = (
                progressive_error(services, root, args.rows, args.error_passes)
                if args.error_passes
                else []
            )
            runs, warm, reference, geo = throughput(
                services, root, args.rows, args.threads, args.set, modes, shipped_label
            )
            figures = (
                memory(services, root, args.memory_passes, args.memory_events)
                if args.memory_passes
                else {}
            )
    for label, (start, peak, keys) in figures.items():
        print(
            f"  eviction {label:<3}  server RSS {start:7.1f} MiB at start, peak {peak:7.1f} MiB"
            f" (+{peak - start:.1f}), {keys:,} keys at the end"
        )
    by_mode = {r.label.split(", 1 thread")[0]: r for r in runs}
    default = by_mode[shipped_label]
    print(f"the shipped default: {shipped.sync_mode}, progressive {shipped.progressive}")
    # rows/s ratios against the reference's training alone (same rows: seconds inverted)
    print(f"RESULT train_ratio {reference / default.train_s:.2f}")
    print(f"RESULT train_command_ratio {reference / default.command_s:.2f}")
    print(f"RESULT pass_critical_path_s {warm.command_s - warm.train_s:.2f}")
    print(f"RESULT pass_critical_path_first_s {default.command_s - default.train_s:.2f}")
    if args.shipped_only:
        return 0
    for mode in ("separate", "sample", "in_train"):
        ratio = reference / by_mode[f"async, {mode}"].command_s
        print(f"RESULT train_command_ratio_{mode} {ratio:.2f}")
    sync, not_sync = by_mode["sync, sample"], by_mode["async, sample"]
    print(f"RESULT sync_over_async {not_sync.train_s / sync.train_s:.2f}")
    print(f"RESULT geo_over_async {geo['async'] / geo['geo']:.2f}")
    for name in ("auc", "logloss", "copc"):
        if compared:
            error = max(abs(c["sample"][name] - c["full"][name]) for c in compared)
            print(f"RESULT progressive_sample_{name}_error_max {error:.4f}")
    for label, (_, peak, _) in figures.items():
        print(f"RESULT server_peak_rss_mib_eviction_{label} {peak:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
