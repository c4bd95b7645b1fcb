"""Each label policy's matured AUC in pass order on one stationary stream, offline: what a
fresh policy costs in quality when freshness is worth nothing (about 2 min per policy).

    .venv/bin/python bench/label_policies.py [--passes 20] [--per-pass 12000]
        [--window-seconds 300] [--wait-seconds 60] [--warmup 5]

The shipped pipeline (``configs/pipeline.yaml``: ctr_dnn, one click label joined from its
topic within ``--window-seconds``, one-minute passes) on the generator's stationary click
model, produced once (``streamrec produce --synthetic``'s stream) and built by one pass
builder per policy of its click: ``after_window`` (the baseline), ``at_once`` (FNW),
``after_wait`` ``--wait-seconds`` (ES-DFM). Each policy's passes are trained in order by a
``streamrec cluster`` of its own, and each pass is judged on its impressions' final labels
by the model trained through the pass before: after_window's progressive metrics, the
fresh policies' matured ones. The gap is the mean over the passes every policy judged,
after ``--warmup``, of the policy's AUC minus after_window's, with the standard error of
that mean over passes.

In a live pipeline a fresh policy's model is also fresher, which this leaves out on
purpose; ``bench/label_freshness.py`` measures both on live streams. A defect in how fresh
rows train shows here in two minutes (docs/decisions/, "The defect: a pass taught
negatives, then positives").

Ends with ``RESULT pass_order_auc_<policy>`` and ``RESULT pass_order_auc_gap_<policy>``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

from calibration import train_on_the_cluster
from label_freshness import policy_configs
from machine import hardware_line

from devservices.local_services import local_services
from streaming.pass_builder import PassBuilder
from streaming.producer import produce_synthetic
from streamrec.config import PipelineConfig, derived, dump_config
from streamrec.passes import complete_passes

FIRST = "202609010000"


def _configs(services, root: Path, args: argparse.Namespace) -> dict[str, PipelineConfig]:
    """Policy -> its pipeline on the stationary stream: label_freshness.py's, with
    ``--per-pass`` impressions a pass."""
    return {
        p.name: derived(p.cfg, "offline passes", synthetic={"events_per_pass": args.per_pass})
        for p in policy_configs(services, root, "stationary", args)
    }


def _judged(cfg: PipelineConfig, config: Path, policy: str, passes: int) -> dict[str, float]:
    """Build the policy's passes from the topics, train the first ``passes`` in order;
    pass id -> the click's AUC on its final labels, by the model before the pass."""
    builder = PassBuilder(cfg)
    try:
        builder.run(drain=True)
    finally:
        builder.close()
    built = sorted(complete_passes(Path(cfg.paths.data_root)))[:passes]
    results = train_on_the_cluster(cfg, config, built)
    if policy == "after_window":
        return {r.pass_id: r.test.auc for r in results}
    return {m.pass_id: m.tasks["click"].auc for r in results for m in r.matured}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=20)
    parser.add_argument("--per-pass", type=int, default=12_000, help="impressions a pass")
    parser.add_argument("--window-seconds", type=int, default=300)
    parser.add_argument("--wait-seconds", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="passes left out of the means")
    args = parser.parse_args()
    print(hardware_line())
    aucs: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="label-policies-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        with local_services(root / "services") as services:
            for i, (policy, cfg) in enumerate(_configs(services, root, args).items()):
                config = dump_config(cfg, root / f"{policy}.yaml")
                if i == 0:
                    produce_synthetic(cfg, FIRST, args.passes)
                aucs[policy] = _judged(cfg, config, policy, args.passes)
                curve = " ".join(f"{aucs[policy][p]:.3f}" for p in sorted(aucs[policy]))
                print(f"{policy}: {curve}", flush=True)
    judged = sorted(set.intersection(*(set(a) for a in aucs.values())))[args.warmup :]
    print(f"\npasses judged by every policy after {args.warmup} of warm-up: {len(judged)}")
    lines = []
    for policy, by_pass in aucs.items():
        mean = statistics.mean(by_pass[p] for p in judged)
        lines.append(f"RESULT pass_order_auc_{policy} {mean:.4f}")
        if policy != "after_window":
            gaps = [by_pass[p] - aucs["after_window"][p] for p in judged]
            se = statistics.stdev(gaps) / math.sqrt(len(gaps))
            print(f"{policy}: {statistics.mean(gaps):+.4f} (standard error {se:.4f})")
            lines.append(f"RESULT pass_order_auc_gap_{policy} {statistics.mean(gaps):.4f}")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
