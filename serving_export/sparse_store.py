"""Where serving looks embeddings up: in the service's memory, or in Redis.

Both build the embeddings of a version from its lineage (the full version it builds on,
then each delta in order, ``artifact.lineage``) and hand out an immutable view: a request
holds one view for its whole scoring, so it never sees half of a delta.

InProcessStore  the table in this process (``LayeredEmbeddings``); a version whose lineage
                holds the version built last applies only the deltas after it.
RedisStore      for tables larger than one serving host. Delivery writes each version's
                keys into its own hash (``push``) and marks the layer complete last; a
                version's view reads its lineage's hashes newest first in one pipelined
                round trip. Layers are never written once complete, so there is nothing
                half-applied to see: a reader either has every layer of a version or does
                not serve it. Key names: ``streamrec.redis_keys``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import redis

from serving_export.artifact import lineage, load_sparse
from serving_export.errors import ServingError
from serving_export.manifest import ArtifactManifest
from serving_export.sparse_table import LayeredEmbeddings
from streamrec.config import RedisConfig
from streamrec.redis_conn import connect
from streamrec.redis_keys import RedisKeys

log = logging.getLogger(__name__)

_WRITE_CHUNK = 2000  # fields per HSET
_PIPELINE_COMMANDS = 50  # HSETs sent per round trip


class Embeddings(Protocol):
    """What scoring needs: the embedding of each feature sign, zeros when unknown."""

    def lookup(self, signs: np.ndarray) -> np.ndarray: ...


class LayerMissing(ServingError):
    """A version's embeddings are not (completely) in the store yet."""


class InProcessStore:
    """Versions' tables in this process's memory."""

    def __init__(self, model_dir: Path, compact_ratio: float = 0.25) -> None:
        self.model_dir = Path(model_dir)
        self.compact_ratio = compact_ratio
        self._last: tuple[str, LayeredEmbeddings] | None = None
        self._lock = threading.Lock()

    def embeddings_for(self, version: str) -> LayeredEmbeddings:
        """The table of ``version``, built from the nearest version already in memory."""
        with self._lock:
            chain = lineage(self.model_dir, version)
            names = [m.version for m in chain]
            if self._last is not None and self._last[0] in names:
                start, table = names.index(self._last[0]) + 1, self._last[1]
            else:
                start = 1
                table = LayeredEmbeddings.of(
                    load_sparse(self.model_dir / names[0]), self.compact_ratio
                )
            for name in names[start:]:
                table = table.apply(load_sparse(self.model_dir / name))
            self._last = (version, table)
            return table


class RedisEmbeddings:
    """One version's view of the Redis layers: its lineage's hashes, newest first."""

    def __init__(self, r: redis.Redis, layers: list[str], dim: int) -> None:
        self._r = r
        self.layers = layers
        self.dim = dim

    def lookup(self, signs: np.ndarray) -> np.ndarray:
        signs = np.asarray(signs, dtype=np.uint64)
        unique, inverse = np.unique(signs, return_inverse=True)
        raw = unique.astype("<u8").tobytes()
        fields = [raw[i : i + 8] for i in range(0, len(raw), 8)]
        with self._r.pipeline(transaction=False) as pipe:
            for layer in self.layers:
                pipe.hmget(layer, fields)
            answers = pipe.execute()
        zero = bytes(4 * self.dim)
        found = [zero] * len(fields)
        for answer in reversed(answers):  # oldest first, so newer layers overwrite
            for i, value in enumerate(answer):
                if value is not None:
                    found[i] = value
        table = np.frombuffer(b"".join(found), dtype="<f4").reshape(len(fields), self.dim)
        return table[inverse].astype(np.float32)


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

    def written(self) -> dict[str, dict[str, Any]]:
        """Versions whose layer is complete, with their summaries."""
        raw = self._r.hgetall(self._keys.sparse_layers(self._model))
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def push(self, version: str) -> dict[str, Any]:
        """Write the layers of ``version``'s lineage that Redis lacks; idempotent. A layer
        left half-written by a killed writer is not marked complete: it is written again."""
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
        return {
            "version": version,
            "layers_written": pushed,
            "keys_written": keys_written,
            "seconds": round(time.perf_counter() - started, 3),
        }

    def _write_layer(self, manifest: ArtifactManifest) -> int:
        name = manifest.version
        table = load_sparse(self.model_dir / name)
        layer = self._keys.sparse_layer(self._model, name)
        self._r.unlink(layer)
        raw_keys = table.keys.astype("<u8").tobytes()
        values = np.ascontiguousarray(table.values, dtype="<f4")
        row = values.shape[1] * 4
        raw_values = values.tobytes()
        n = len(table.keys)
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
        summary = {
            "kind": manifest.sparse.kind,
            "parent": manifest.sparse.parent,
            "keys": n,
            "dim": int(values.shape[1]),
        }
        self._r.hset(self._keys.sparse_layers(self._model), name, json.dumps(summary))
        log.info("redis: wrote %d keys of %s (%s)", n, name, summary["kind"])
        return n

    def embeddings_for(self, version: str) -> RedisEmbeddings:
        """A view of ``version``: every layer of its lineage must be complete."""
        chain = lineage(self.model_dir, version)
        done = self.written()
        missing = [m.version for m in chain if m.version not in done]
        if missing:
            raise LayerMissing(f"version {version}: Redis lacks the layers of {missing}")
        layers = [self._keys.sparse_layer(self._model, m.version) for m in reversed(chain)]
        return RedisEmbeddings(self._r, layers, chain[-1].embedding_dim)

    def drop(self, version: str) -> None:
        """Delete a version's layer (retention: versions no kept version builds on)."""
        self._r.hdel(self._keys.sparse_layers(self._model), version)
        self._r.unlink(self._keys.sparse_layer(self._model, version))
