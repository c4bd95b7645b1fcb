"""Where serving looks embeddings up: in the service's memory, or in Redis.

Both build the embeddings of a version from its lineage (the full version it builds on,
then each delta in order, ``artifact.lineage``) and hand out an immutable view of every
sparse table it has: a request holds one view for its whole scoring, so it never sees half
of a delta.

InProcessStore  the tables in this process (``LayeredTables``); a version whose lineage
                holds the version built last applies only the deltas after it.
RedisStore      for tables larger than one serving host. Delivery writes each version's
                keys into a hash per table (``push``) and marks the layer complete last; a
                version's view reads a table's lineage hashes newest first in one
                pipelined round trip. Layers are never written once complete, so there is nothing
                half-applied to see: a reader either has every layer of a version or does
                not serve it. Key names: ``streamrec.redis_keys``.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Protocol

import numpy as np
import redis

from serving_export.artifact import lineage, load_sparse
from serving_export.errors import ServingError
from serving_export.manifest import ArtifactManifest
from serving_export.sparse_table import LayeredTables
from streamrec.config import RedisConfig
from streamrec.contracts.delivery import LayerSummary, RedisPush, TableLayer
from streamrec.redis_conn import connect, scan_keys
from streamrec.redis_keys import RedisKeys

log = logging.getLogger(__name__)

_WRITE_CHUNK = 2000  # fields per HSET
_PIPELINE_COMMANDS = 50  # HSETs sent per round trip


class Embeddings(Protocol):
    """What scoring needs: the embedding of each feature sign in a sparse table, zeros when
    the table does not hold it."""

    def lookup(self, table: str, signs: np.ndarray) -> np.ndarray: ...


class LayerMissing(ServingError):
    """A version's embeddings are not (completely) in the store yet."""


class InProcessStore:
    """Versions' tables in this process's memory."""

    def __init__(self, model_dir: Path, compact_ratio: float = 0.25) -> None:
        self.model_dir = Path(model_dir)
        self.compact_ratio = compact_ratio
        self._last: tuple[str, LayeredTables] | None = None
        self._lock = threading.Lock()

    def embeddings_for(self, version: str) -> LayeredTables:
        """The tables of ``version``, built from the nearest version already in memory."""
        with self._lock:
            chain = lineage(self.model_dir, version)
            names = [m.version for m in chain]
            if self._last is not None and self._last[0] in names:
                start, tables = names.index(self._last[0]) + 1, self._last[1]
            else:
                start = 1
                full = load_sparse(self.model_dir / names[0], chain[0])
                tables = LayeredTables.of(full, self.compact_ratio)
            for manifest in chain[start:]:
                tables = tables.apply(load_sparse(self.model_dir / manifest.version, manifest))
            self._last = (version, tables)
            return tables


class RedisEmbeddings:
    """One version's view of the Redis layers: per table, its lineage's hashes, newest
    first, and the table's width."""

    def __init__(self, r: redis.Redis, layers: dict[str, list[str]], dims: dict[str, int]) -> None:
        self._r = r
        self.layers = layers
        self.dims = dims

    def lookup(self, table: str, signs: np.ndarray) -> np.ndarray:
        layers, dim = self.layers[table], self.dims[table]
        signs = np.asarray(signs, dtype=np.uint64)
        unique, inverse = np.unique(signs, return_inverse=True)
        raw = unique.astype("<u8").tobytes()
        fields = [raw[i : i + 8] for i in range(0, len(raw), 8)]
        with self._r.pipeline(transaction=False) as pipe:
            for layer in layers:
                pipe.hmget(layer, fields)
            answers = pipe.execute()
        zero = bytes(4 * dim)
        found = [zero] * len(fields)
        for answer in reversed(answers):  # oldest first, so newer layers overwrite
            for i, value in enumerate(answer):
                if value is not None:
                    found[i] = value
        rows = np.frombuffer(b"".join(found), dtype="<f4").reshape(len(fields), dim)
        return rows[inverse].astype(np.float32)


class RedisStore:
    """Versions' embeddings in Redis, one immutable hash per version."""

    def __init__(self, r: redis.Redis, keys: RedisKeys, model: str, model_dir: Path) -> None:
        self._r = r  # binary: decode_responses=False
        self._keys = keys
        self._model = model
        self.model_dir = Path(model_dir)

    @classmethod
    def from_config(
        cls, rc: RedisConfig, keys: RedisKeys, model: str, model_dir: Path
    ) -> RedisStore:
        return cls(connect(rc, decode=False), keys, model, model_dir)

    def written(self) -> dict[str, LayerSummary]:
        """Versions whose layer is complete, with their summaries."""
        key = self._keys.sparse_layers(self._model)
        raw = self._r.hgetall(key)
        return {
            k.decode(): LayerSummary.from_wire(v, f"{key}[{k.decode()}]") for k, v in raw.items()
        }

    def push(self, version: str) -> RedisPush:
        """Write the layers of ``version``'s lineage that Redis lacks (a layer: a version's
        hash per table); idempotent. A layer left half-written by a killed writer is not
        marked complete: it is written again."""
        chain = lineage(self.model_dir, version)
        done = self.written()
        started = time.perf_counter()
        pushed, keys_written = [], 0
        for manifest in chain:
            name = manifest.version
            if name in done:
                continue
            keys_written += self._write_layer(manifest)
            pushed.append(name)
        return RedisPush(
            version=version,
            layers_written=tuple(pushed),
            keys_written=keys_written,
            seconds=round(time.perf_counter() - started, 3),
        )

    def _write_layer(self, manifest: ArtifactManifest) -> int:
        name = manifest.version
        written = {}
        for table, embeddings in load_sparse(self.model_dir / name, manifest).items():
            layer = self._keys.sparse_layer(self._model, name, table)
            self._r.unlink(layer)
            self._write_hash(layer, embeddings.keys, embeddings.values)
            written[table] = TableLayer(keys=len(embeddings.keys), dim=embeddings.dim)
        n = sum(t.keys for t in written.values())
        summary = LayerSummary(
            kind=manifest.sparse.kind, parent=manifest.sparse.parent, keys=n, tables=written
        )
        self._r.hset(self._keys.sparse_layers(self._model), name, summary.to_json())
        log.info("redis: wrote %d keys of %s (%s)", n, name, summary.kind)
        return n

    def _write_hash(self, layer: str, keys: np.ndarray, values: np.ndarray) -> None:
        raw_keys = keys.astype("<u8").tobytes()
        values = np.ascontiguousarray(values, dtype="<f4")
        row = values.shape[1] * 4
        raw_values = values.tobytes()
        n = len(keys)
        with self._r.pipeline(transaction=False) as pipe:
            for c, start in enumerate(range(0, n, _WRITE_CHUNK)):
                stop = min(start + _WRITE_CHUNK, n)
                pipe.hset(
                    layer,
                    mapping={
                        raw_keys[8 * i : 8 * i + 8]: raw_values[row * i : row * i + row]
                        for i in range(start, stop)
                    },
                )
                if (c + 1) % _PIPELINE_COMMANDS == 0:
                    pipe.execute()
            pipe.execute()

    def embeddings_for(self, version: str) -> RedisEmbeddings:
        """A view of ``version``: every layer of its lineage must be complete."""
        chain = lineage(self.model_dir, version)
        done = self.written()
        missing = [m.version for m in chain if m.version not in done]
        if missing:
            raise LayerMissing(f"version {version}: Redis lacks the layers of {missing}")
        tables = chain[-1].sparse_tables
        layers = {
            table: [self._keys.sparse_layer(self._model, m.version, table) for m in reversed(chain)]
            for table in tables
        }
        return RedisEmbeddings(self._r, layers, {name: t.dim for name, t in tables.items()})

    def drop(self, version: str) -> None:
        """Delete a version's layer, every table's (retention: versions no kept version
        builds on)."""
        self._r.hdel(self._keys.sparse_layers(self._model), version)
        pattern = self._keys.sparse_layer_pattern(self._model, version)
        for key in scan_keys(self._r, pattern):
            self._r.unlink(key)
