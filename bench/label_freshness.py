"""Freshness and matured quality of every label policy side by side, on one live stream
each of a drifting and a stationary click model, in the same run.

    .venv/bin/python bench/label_freshness.py [--minutes 25] [--rate 200]
        [--window-seconds 300] [--wait-seconds 60] [--half-life-minutes 10]

The shipped pipeline (``configs/pipeline.yaml``: ctr_dnn, one click label joined from its
topic within ``--window-seconds``) with one-minute passes, once per policy of its click:
``after_window`` (the baseline: the row waits for the window), ``at_once`` (FNW) and
``after_wait`` ``--wait-seconds`` (ES-DFM). Per stream, one live producer (``streamrec
produce --live``'s loop: impressions timed now, each click when it happens) feeds the three
pass builders, each in its own consumer group and data root, on one local broker; the
drifting stream's click model moves as an Ornstein-Uhlenbeck walk with the given
half-life (``synthetic.drift_half_life_minutes``), the stationary one's stays. After the
stream, each pipeline's passes are trained in order by a ``streamrec cluster`` of its own.

Per policy:

- freshness: for every impression, its first trainable row's pass manifest written less
  the impression's event time; the median;
- matured AUC, as served: trained offline, every pipeline would see each pass's labels in
  time, so each window's impressions are scored (``score``) by the model a live pipeline
  would have served when the window began: trained through the newest pass whose manifest
  was written by then (training time left out, alike for all). The scores of the
  window's impressions (each once) are judged on their final labels (``after_window``'s
  rows, the same events); the gap is the mean over the windows all three scored, after
  ``--warmup``, of the policy's AUC minus ``after_window``'s. The cluster's own matured
  metrics (a pass judged on the model trained through the pass before, in pass order)
  are printed beside, for reference;
- matured COPC, as served: actual over predicted clicks pooled over those windows, with a
  bar of four standard errors of the pooled ratio under Bernoulli sampling at the
  predictions, its variance tripled as in tests/integration/test_fresh_labels.py.

Ends with ``RESULT label_freshness_s_<policy>``, ``matured_auc_gap_<policy>`` and
``matured_copc_<policy>`` for each stream (``_stationary`` appended to the stationary
stream's names), and ``matured_copc_bar`` lines.
"""

from __future__ import annotations

import argparse
import math
import pickle
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from calibration import train_on_the_cluster
from machine import hardware_line
from pipeline import REPO

from devservices.local_services import local_services
from streaming.pass_builder import PassBuilder
from streaming.producer import produce_live
from streamrec.auc import exact_auc
from streamrec.config import PipelineConfig, derived, dump_config, kind_column, load_config
from streamrec.config.cluster import PathConfig
from streamrec.contracts.training import PassMetrics, TrainResult
from streamrec.passes import RowKind, complete_passes, pass_dir, read_manifest
from trainers.control_plane import ClusterClient

POLICIES = ("after_window", "at_once", "after_wait")
STREAMS = ("drifting", "stationary")


@dataclass
class Policy:
    """One policy's pipeline on one stream, and what it measured."""

    name: str
    cfg: PipelineConfig
    freshness: list[float] = field(default_factory=list)  # seconds, per impression
    results: list[TrainResult] = field(default_factory=list)
    served: dict[str, pa.Table] = field(default_factory=dict)  # window -> event_id, p_click

    def matured(self) -> dict[str, PassMetrics]:
        """Pass id -> the click's metrics on final labels of its progressive scores."""
        if self.name == "after_window":
            return {r.pass_id: r.test for r in self.results}
        return {m.pass_id: m.tasks["click"] for r in self.results for m in r.matured}


def policy_configs(services, root: Path, stream: str, args: argparse.Namespace) -> list[Policy]:
    base = load_config(REPO / "configs/pipeline.yaml")
    fs = base.feature_schema.model_dump(mode="json")
    policies = []
    for policy in POLICIES:
        click = {
            "name": "click",
            "source": "topic",
            "topic": f"clicks-{stream}",
            "window_seconds": args.window_seconds,
            "emit": policy,
        }
        if policy == "after_wait":
            click["wait_seconds"] = args.wait_seconds
        name = f"fresh{stream[:4]}{policy.replace('_', '')}"
        cfg = derived(
            base,
            f"the {stream} stream's {policy} pipeline",
            name=name,
            schema={**fs, "labels": [click]},
            join={"mode": "label_in_impression"},
            kafka={
                "bootstrap_servers": services.bootstrap_servers,
                "impressions_topic": f"impressions-{stream}",
                "consumer_group": name,
            },
            redis={"url": services.redis_url},
            passes={"pass_seconds": 60, "allowed_lateness_seconds": 10},
            synthetic={
                "drift_half_life_minutes": args.half_life_minutes if stream == "drifting" else None
            },
            paths=PathConfig.under(root / stream / policy),
        )
        policies.append(Policy(policy, cfg))
    return policies


def _build(cfg: PipelineConfig, stop: threading.Event) -> None:
    builder = PassBuilder(cfg)
    try:
        builder.run(stop=stop)
    finally:
        builder.close()


def _first_rows(policy: Policy, pass_id: str, columns: list[str]) -> pa.Table:
    """``columns`` of the pass's rows that are its impressions' first trainable rows (a
    fresh policy's observed rows; every row after the window)."""
    directory = pass_dir(policy.cfg.paths.data_root, pass_id)
    kind = kind_column("click")
    fresh = policy.name != "after_window"
    parts = [
        pq.read_table(directory / part.file, columns=[*columns, kind] if fresh else columns)
        for part in read_manifest(directory).parts
    ]
    if not parts:  # an empty pass
        return pa.table({c: pa.array([], pa.int64()) for c in columns})
    table = pa.concat_tables(parts)
    if fresh:
        table = table.filter(pc.equal(table[kind], int(RowKind.OBSERVED)))
    return table


def _freshness(policy: Policy) -> list[float]:
    """Seconds from each impression's event time to its first trainable row's pass being
    written."""
    root = Path(policy.cfg.paths.data_root)
    out: list[float] = []
    for pass_id in complete_passes(root):
        times = _first_rows(policy, pass_id, ["event_time_ms"])["event_time_ms"].to_numpy()
        out += ((_written_ms(root, pass_id) - times) / 1000).tolist()
    return out


def _live(policies: dict[str, list[Policy]], minutes: float, rate: float) -> None:
    """Both streams live for ``minutes``, each into its three builders."""
    stop = threading.Event()
    producers = [
        threading.Thread(target=produce_live, args=(ps[0].cfg, rate, stop), daemon=True)
        for ps in policies.values()
    ]
    builders = [
        threading.Thread(target=_build, args=(p.cfg, stop), daemon=True)
        for ps in policies.values()
        for p in ps
    ]
    for t in producers:
        t.start()
    time.sleep(5)  # the producers make the topics
    for t in builders:
        t.start()
    stop.wait(minutes * 60)
    stop.set()
    for t in [*producers, *builders]:
        t.join(timeout=180)


def _written_ms(root: Path, pass_id: str) -> float:
    created = read_manifest(pass_dir(root, pass_id)).created_at
    return datetime.fromisoformat(created).timestamp() * 1000


def _impressions(policy: Policy, pass_id: str) -> set[str]:
    """The event ids whose first trainable row is in ``pass_id``: its window's impressions."""
    return set(_first_rows(policy, pass_id, ["event_id"])["event_id"].to_pylist())


def _train_and_serve(policy: Policy, windows: list[str]) -> None:
    """Train the policy's passes in order on a cluster of its own; after each, score the
    windows whose live model it would have been."""
    root = Path(policy.cfg.paths.data_root)
    passes = complete_passes(root)
    written = {p: _written_ms(root, p) for p in passes}
    serving: dict[str, list[str]] = {}  # pass -> the windows its model would have served
    for window in windows:
        start = policy.cfg.passes.clock.window(window)[0]
        ready = [p for p in passes if written[p] <= start]
        if ready and window in written:
            serving.setdefault(max(ready), []).append(window)
    config = dump_config(policy.cfg, Path(policy.cfg.paths.work_root) / "pipeline.yaml")

    def after(client: ClusterClient, pass_id: str) -> None:
        for window in serving.get(pass_id, []):
            scores = pq.read_table([r.predictions for r in client.score(window)])
            mine = pa.array(sorted(_impressions(policy, window)))
            scores = scores.filter(pc.is_in(scores["event_id"], mine))
            policy.served[window] = _first_per_id(scores)

    policy.results = train_on_the_cluster(policy.cfg, config, passes, after=after)


def _first_per_id(scores: pa.Table) -> pa.Table:
    """One prediction per event id (an impression's duplicate rows score as its row)."""
    ids = scores["event_id"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ids, return_index=True)
    return scores.take(pa.array(first))


def _labels(policy: Policy) -> dict[str, int]:
    """Every impression's final click label, from the after_window pipeline's rows."""
    root = policy.cfg.paths.data_root
    labels: dict[str, int] = {}
    for pass_id in complete_passes(root):
        directory = pass_dir(root, pass_id)
        for part in read_manifest(directory).parts:
            table = pq.read_table(directory / part.file, columns=["event_id", "label"])
            ids, clicks = table["event_id"].to_pylist(), table["label"].to_pylist()
            labels.update(zip(ids, clicks, strict=True))
    return labels


@dataclass(frozen=True)
class Served:
    """A window's served scores judged on the final labels."""

    auc: float
    actual: float
    predicted: float
    variance: float  # of the actual clicks under the predictions (Bernoulli)


def _judge(scores: pa.Table, labels: dict[str, int]) -> Served:
    ids = scores["event_id"].to_pylist()
    p = scores["p_click"].to_numpy().astype(np.float64)
    keep = np.array([i in labels for i in ids])
    y = np.array([labels[i] for i, k in zip(ids, keep, strict=True) if k], dtype=np.float64)
    p = p[keep]
    return Served(exact_auc(p, y), float(y.sum()), float(p.sum()), float((p * (1 - p)).sum()))


def _report(stream: str, policies: list[Policy], warmup: int) -> list[str]:
    labels = _labels(policies[0])
    served = {p.name: {w: _judge(t, labels) for w, t in p.served.items()} for p in policies}
    common = sorted(set.intersection(*(set(s) for s in served.values())))[warmup:]
    base = served["after_window"]
    in_order = policies[0].matured()
    results = []
    suffix = "" if stream == "drifting" else "_stationary"
    print(f"\n{stream} stream: {len(common)} windows compared ({', '.join(common[:1])}...)")
    for policy in policies:
        mine = served[policy.name]
        gaps = [mine[w].auc - base[w].auc for w in common]
        actual = sum(mine[w].actual for w in common)
        predicted = sum(mine[w].predicted for w in common)
        copc = actual / predicted if predicted else math.nan
        variance = 3 * sum(mine[w].variance for w in common)
        bar = 4 * math.sqrt(variance) / predicted if predicted else math.nan
        fresh = statistics.median(policy.freshness) if policy.freshness else math.nan
        gap = statistics.mean(gaps) if gaps else math.nan
        error = statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else math.nan
        matured = policy.matured()
        ordered = [matured[w].auc - in_order[w].auc for w in common if w in matured]
        in_order_gap = statistics.mean(ordered) if ordered else math.nan
        print(
            f"  {policy.name:12s} freshness median {fresh:7.1f} s over "
            f"{len(policy.freshness):,} impressions; as served: AUC "
            f"{statistics.mean(mine[w].auc for w in common) if common else math.nan:.4f}, "
            f"gap {gap:+.4f} (standard "
            f"error {error:.4f}), COPC {copc:.3f} (bar {bar:.3f}); in pass order (the "
            f"cluster's matured metrics) gap {in_order_gap:+.4f}"
        )
        for w in common:
            print(
                f"    {w}  AUC {mine[w].auc:.4f}  after_window {base[w].auc:.4f}  "
                f"COPC {mine[w].actual / mine[w].predicted:.3f}"
            )
        results += [
            f"RESULT label_freshness_s_{policy.name}{suffix} {fresh:.1f}",
            f"RESULT matured_auc_gap_{policy.name}{suffix} {gap:.4f}",
            f"RESULT matured_copc_{policy.name}{suffix} {copc:.4f}",
            f"RESULT matured_copc_bar_{policy.name}{suffix} {bar:.4f}",
        ]
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=25, help="how long the streams run")
    parser.add_argument("--rate", type=float, default=200, help="impressions per second")
    parser.add_argument("--window-seconds", type=int, default=300)
    parser.add_argument("--wait-seconds", type=int, default=60)
    parser.add_argument("--half-life-minutes", type=float, default=10)
    parser.add_argument("--warmup", type=int, default=3, help="passes left out of the means")
    parser.add_argument("--streams", default=",".join(STREAMS))
    args = parser.parse_args()
    # after_window's first model is written a window and a pass after the stream starts,
    # and a window is judged once its own labels are final: a window and a pass before
    # the end; five windows compared after the warm-up on top
    shortest = 2 * args.window_seconds / 60 + args.warmup + 7
    if args.minutes < shortest:
        parser.error(
            f"--minutes {args.minutes:g} leaves no window every policy can be judged on: "
            f"at least {shortest:g} with --window-seconds {args.window_seconds} and "
            f"--warmup {args.warmup}"
        )
    print(hardware_line())
    streams = [s for s in args.streams.split(",") if s]
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="label-freshness-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        with local_services(root / "services") as services:
            policies = {s: policy_configs(services, root, s, args) for s in streams}
            _live(policies, args.minutes, args.rate)
            for stream, ps in policies.items():
                windows = complete_passes(ps[0].cfg.paths.data_root)
                for policy in ps:
                    policy.freshness = _freshness(policy)
                    _train_and_serve(policy, windows)
                    print(
                        f"{stream} {policy.name}: trained {len(policy.results)} passes, "
                        f"scored {len(policy.served)} windows as served",
                        flush=True,
                    )
            with (root.parent / f"label-freshness-{int(time.time())}.pickle").open("wb") as f:
                measured = {
                    s: (_labels(ps[0]), [(p.name, p.freshness, p.results, p.served) for p in ps])
                    for s, ps in policies.items()
                }
                pickle.dump(measured, f)  # should the report need another look
            for stream, ps in policies.items():
                lines += _report(stream, ps, args.warmup)
    print()
    print("\n".join(lines))
    return 0 if all(not np.isnan(float(x.split()[-1])) for x in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
