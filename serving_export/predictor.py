"""Score events with one model version: its dense program and its embeddings.

    streamrec predict --config configs/pipeline.yaml --events events.jsonl

Events are validated as ``/predict`` validates them (``streaming.events.scoring_row``; in
``streamrec predict`` a bad line is exit 4, naming the line and the reason), sparse values
become feature signs with the same hash as training, each slot's embeddings are looked up
(zeros for values training never saw) and pooled as the schema says (summed, averaged, or a
sequence padded with its mask), and Paddle Inference runs the dense program. A Predictor
is immutable and thread-safe: it holds a pool of Paddle predictors (clones sharing the
weights), one per concurrent scorer; the service swaps whole Predictors between versions.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from serving_export.artifact import MODEL_PREFIX, ONNX_NAME, verify_artifact, version_dir
from serving_export.registry import ModelRegistry
from serving_export.sparse_store import Embeddings, InProcessStore
from streaming.errors import MalformedEvent
from streaming.events import scoring_row
from streaming.feature_signs import SIGN_VERSION, signs_of_values
from streaming.sequences import cut_list
from streamrec.config import load_config
from streamrec.entry import run_command
from streamrec.errors import ContractError, StreamrecError
from streamrec.signals import handlers_kept

log = logging.getLogger(__name__)


class PaddleDense:
    """The dense program on Paddle Inference: one predictor, one batch at a time, with
    ``threads`` math threads."""

    def __init__(self, directory: Path, threads: int) -> None:
        with handlers_kept():  # the service's SIGTERM handler, not glog's (streamrec.signals)
            import paddle.inference as pi

        config = pi.Config(
            str(directory / f"{MODEL_PREFIX}.pdmodel"), str(directory / f"{MODEL_PREFIX}.pdiparams")
        )
        config.disable_gpu()
        config.disable_glog_info()
        config.set_cpu_math_library_num_threads(threads)
        self._predictor = pi.create_predictor(config)
        self._lock = threading.Lock()  # a Paddle predictor is not reentrant

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Each output's scores, ``[outputs, rows]``."""
        predictor = self._predictor
        with self._lock:
            for name in predictor.get_input_names():
                predictor.get_input_handle(name).copy_from_cpu(feeds[name])
            predictor.run()
            outs = [
                predictor.get_output_handle(name).copy_to_cpu().reshape(-1)
                for name in predictor.get_output_names()
            ]
            return np.stack(outs)


class OnnxDense:
    """The dense program exported to ONNX (``model.onnx``) on onnxruntime, whose sessions
    run concurrently."""

    def __init__(self, directory: Path, threads: int) -> None:
        import onnxruntime as ort

        path = directory / ONNX_NAME
        if not path.is_file():
            raise StreamrecError(f"{directory} has no {ONNX_NAME}: serve it with runtime paddle")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self._inputs = [i.name for i in self._session.get_inputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """Each output's scores, ``[outputs, rows]``."""
        outs = self._session.run(None, {name: feeds[name] for name in self._inputs})
        return np.stack([np.asarray(out).reshape(-1) for out in outs])


class Predictor:
    """Scores events with one artifact version, on Paddle Inference or onnxruntime (a
    version without an ONNX program, which the converter could not make, on Paddle
    whatever the runtime asked; ``runtime`` says which runs)."""

    def __init__(
        self,
        directory: Path,
        embeddings: Embeddings | None = None,
        threads: int = 1,
        runtime: str = "paddle",
    ) -> None:
        self.directory = Path(directory)
        self.manifest = verify_artifact(self.directory)
        self.version = self.manifest.version
        if self.manifest.sign_version != SIGN_VERSION:
            raise StreamrecError(
                f"artifact hashes features with version {self.manifest.sign_version}, "
                f"this code with {SIGN_VERSION}"
            )
        self.schema = self.manifest.feature_schema
        self.tasks = self.manifest.tasks  # what each row of ``score_tasks`` predicts
        self.embeddings = (
            embeddings
            if embeddings is not None
            else InProcessStore(self.directory.parent).embeddings_for(self.version)
        )
        if runtime == "onnx" and self.manifest.onnx.file is None:
            # a network the converter could not take ships its Paddle program alone
            log.warning(
                "version %s has no ONNX program (%s): scoring it on Paddle Inference",
                self.version,
                self.manifest.onnx.error,
            )
            runtime = "paddle"
        self.runtime = runtime
        self._dense = (
            OnnxDense(self.directory, threads)
            if runtime == "onnx"
            else PaddleDense(self.directory, threads)
        )

    @classmethod
    def serving(cls, model_root: Path, registry: ModelRegistry) -> Predictor:
        """The predictor of the version the registry marks as serving."""
        manifest = registry.serving()
        return cls(version_dir(version_dir(Path(model_root), manifest.model), manifest.version))

    def _slot_feeds(self, rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
        """Each slot's feed from one lookup per sparse table of every sign of the batch
        (one round trip each with the Redis store): pooled as training pooled it (sum or
        mean), or a sequence cut as the pipe reader cuts it, padded with zeros, and its
        mask."""
        table_of = self.manifest.table_of_slot
        signs: dict[str, list[np.ndarray]] = {t: [] for t in self.manifest.sparse_tables}
        bounds = []
        for slot in self.schema.sparse:
            values = [r[slot.name] for r in rows]
            if slot.max_length:
                values = [cut_list(v, slot.max_length, slot.keep) for v in values]
            lengths = np.array([len(v) for v in values]) if slot.multi else np.ones(len(rows), int)
            flat = [x for v in values for x in v] if slot.multi else values
            signs[table_of[slot.name]].append(signs_of_values(slot.key_slot, flat))
            bounds.append(lengths)
        found = {
            table: iter(
                np.split(self.embeddings.lookup(table, np.concatenate(parts)), _ends(parts))
            )
            for table, parts in signs.items()
            if parts
        }
        feeds = {}
        for slot, lengths in zip(self.schema.sparse, bounds, strict=True):
            part = next(found[table_of[slot.name]])
            offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
            if slot.max_length:
                values_feed, mask_feed = self.manifest.sequence_feeds[slot.name]
                rows_of = np.repeat(np.arange(len(rows)), lengths)
                position = np.arange(len(part)) - np.repeat(offsets, lengths)
                padded = np.zeros((len(rows), slot.max_length, part.shape[1]), np.float32)
                mask = np.zeros((len(rows), slot.max_length), np.float32)
                padded[rows_of, position] = part
                mask[rows_of, position] = 1.0
                feeds[values_feed], feeds[mask_feed] = padded, mask
            elif slot.multi:
                pooled = np.add.reduceat(part, offsets, axis=0)
                if slot.pooling == "mean":
                    pooled = pooled / lengths[:, None].astype(np.float32)
                feeds[self.manifest.slot_feeds[slot.name]] = pooled
            else:
                feeds[self.manifest.slot_feeds[slot.name]] = part
        return feeds

    def score_tasks(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """Each task's probabilities of feature rows (``streaming.events.feature_row``),
        ``[len(tasks), rows]``, in ``tasks``' order (the main task first)."""
        if not rows:
            return np.zeros((len(self.tasks), 0), dtype=np.float32)
        feeds = self._slot_feeds(rows)
        if self.manifest.dense_feed:
            feeds[self.manifest.dense_feed] = np.array(
                [[r[d.name] for d in self.schema.dense] for r in rows], dtype=np.float32
            )
        return self._dense.run(feeds)

    def score_rows(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """The main task's (click) probabilities of feature rows."""
        return self.score_tasks(rows)[0]

    def score(self, events: list[Any]) -> np.ndarray:
        """The main task's (click) probabilities of ``events`` (impression events),
        validated as ``/predict`` validates them: MalformedEvent naming the first bad one."""
        rows = []
        for i, event in enumerate(events):
            try:
                rows.append(scoring_row(event, self.schema))
            except MalformedEvent as e:
                raise MalformedEvent(e.reason, f"events[{i}]: {e.detail}") from None
        return self.score_rows(rows)


def _ends(parts: list[np.ndarray]) -> np.ndarray:
    """Where each of ``parts`` ends in their concatenation, the last one's end left out
    (``np.split``'s indices)."""
    return np.cumsum([len(p) for p in parts])[:-1]


def parser() -> argparse.ArgumentParser:
    """The command's arguments (the CLI reference is generated from them)."""
    parser = argparse.ArgumentParser(
        prog="streamrec predict", description="Score events with the serving model."
    )
    parser.add_argument(
        "--config", required=True, type=Path, help="pipeline YAML with a real Redis"
    )
    parser.add_argument("--events", required=True, type=Path, help="JSON-lines impression events")
    return parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    return run_command(lambda: _predict(args.config, args.events))


def _predict(config: Path, events_file: Path) -> int:
    from serving_export.delivery import registry_for

    cfg = load_config(config)
    predictor = Predictor.serving(cfg.paths.model_root, registry_for(cfg))
    events, rows = [], []
    for n, text in enumerate(events_file.read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            event = json.loads(text)
        except ValueError as e:
            raise ContractError(f"{events_file}:{n}: bad_json: {e}") from None
        try:
            rows.append(scoring_row(event, predictor.schema))
        except MalformedEvent as e:
            raise ContractError(f"{events_file}:{n}: {e}") from None
        events.append(event)
    scores = predictor.score_tasks(rows)
    several = len(predictor.tasks) > 1
    for i, event in enumerate(events):
        line: dict[str, Any] = {"event_id": event.get("event_id")}
        line["p_click"] = round(float(scores[0, i]), 6)
        if several:  # each task's probability by its label's name
            line["p"] = {t: round(float(scores[k, i]), 6) for k, t in enumerate(predictor.tasks)}
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
