"""The reference predictor serving uses: load a registered artifact and score events.

    streamrec predict --config configs/pipeline.yaml --events events.jsonl

Events are validated like the pass builder does, sparse values become feature signs with
the same hash as training, each slot's embeddings are looked up in the artifact and
sum-pooled, and Paddle Inference runs the dense program.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from serving_export.artifact import MODEL_PREFIX, verify_artifact
from serving_export.sparse_table import SparseEmbeddings
from streaming.events import normalize_event
from streaming.feature_signs import SIGN_VERSION, signs_of
from streamrec.config import SchemaConfig, load_config
from streamrec.errors import StreamrecError
from streamrec.logs import setup_logging


class Predictor:
    """Scores events with one artifact."""

    def __init__(self, directory: Path) -> None:
        import paddle.inference as pi

        self.directory = Path(directory)
        self.manifest = verify_artifact(self.directory)
        if self.manifest["sign_version"] != SIGN_VERSION:
            raise StreamrecError(
                f"artifact hashes features with version {self.manifest['sign_version']}, "
                f"this code with {SIGN_VERSION}"
            )
        self.schema = SchemaConfig.model_validate(self.manifest["feature_schema"])
        self.embeddings = SparseEmbeddings(
            np.load(self.directory / "sparse" / "keys.npy"),
            np.load(self.directory / "sparse" / "values.npy"),
        )
        config = pi.Config(
            str(self.directory / f"{MODEL_PREFIX}.pdmodel"),
            str(self.directory / f"{MODEL_PREFIX}.pdiparams"),
        )
        config.disable_gpu()
        config.disable_glog_info()
        self._predictor = pi.create_predictor(config)

    @classmethod
    def serving(cls, model_root: Path, registry: Any) -> Predictor:
        """The predictor of the version the registry marks as serving."""
        manifest = registry.serving()
        return cls(Path(model_root) / manifest["model"] / manifest["version"])

    def _pooled(self, slot: str, values: list[Any], multi: bool) -> np.ndarray:
        if not multi:
            return self.embeddings.lookup(signs_of(slot, pa.array(values, pa.string())))
        lengths = np.array([len(v) for v in values])
        flat = [x for v in values for x in v]
        emb = self.embeddings.lookup(signs_of(slot, pa.array(flat, pa.string())))
        return np.add.reduceat(emb, np.concatenate([[0], np.cumsum(lengths)[:-1]]), axis=0)

    def score(self, events: list[dict[str, Any]]) -> np.ndarray:
        """Click probabilities of ``events`` (dicts in the impression event format)."""
        if not events:
            return np.zeros(0, dtype=np.float32)
        rows = [normalize_event({"label": 0, **e}, self.schema) for e in events]
        feeds: dict[str, np.ndarray] = {}
        for slot in self.schema.sparse:
            feeds[self.manifest["slot_feeds"][slot.name]] = self._pooled(
                slot.name, [r[slot.name] for r in rows], slot.multi
            )
        if self.manifest["dense_feed"]:
            feeds[self.manifest["dense_feed"]] = np.array(
                [[r[d.name] for d in self.schema.dense] for r in rows], dtype=np.float32
            )
        for name in self._predictor.get_input_names():
            self._predictor.get_input_handle(name).copy_from_cpu(feeds[name])
        self._predictor.run()
        out = self._predictor.get_output_handle(self._predictor.get_output_names()[0])
        return out.copy_to_cpu().reshape(-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="streamrec predict", description="Score events with the serving model."
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="pipeline YAML with a real Redis"
    )
    parser.add_argument("--events", required=True, type=Path, help="JSON-lines impression events")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        from serving_export.delivery import registry_for

        cfg = load_config(args.config)
        predictor = Predictor.serving(cfg.paths.model_root, registry_for(cfg))
        events = [json.loads(line) for line in args.events.read_text().splitlines() if line.strip()]
        for event, p in zip(events, predictor.score(events), strict=True):
            print(json.dumps({"event_id": event.get("event_id"), "p_click": round(float(p), 6)}))
    except StreamrecError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
