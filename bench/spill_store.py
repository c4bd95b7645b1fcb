"""Which maintained store the join spills its waiting rows to: RocksDB (rocksdict) against
LMDB (py-lmdb) on the join's own workload, in the same run.

    .venv/bin/python bench/spill_store.py [--ids 4000000]

The workload is what ``streaming.join_spill`` asks of its store: an index of event ids to
impression times written in batches of 50,000 (one checkpoint's worth), segments of Arrow
IPC bytes (a window's rows, 4 MiB values), point lookups of label events (a tenth of the
ids, as many again absent: labels whose impression is not held), then every key deleted
in batches (the windows' rows written). Measured for each: puts/s, lookups/s, deletes/s,
the process's resident memory growth with the store open (anonymous, and file pages
mapped), and bytes on disk after the
puts. Ends with ``RESULT spill_<store>_<figure>`` lines.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import lmdb
import rocksdict
from machine import hardware_line

BATCH = 50_000
SEGMENT = 4 << 20
MIB = 1 << 20
PACK = struct.Struct("<q")


def _rss() -> tuple[int, int]:
    """Resident anonymous memory (the heap, a block cache) and resident file pages (a
    memory map: the kernel drops them under pressure), in bytes."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return (int(fields["RssAnon"].split()[0]) * 1024, int(fields["RssFile"].split()[0]) * 1024)


def _disk(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


class _Rocks:
    def __init__(self, path: Path, cache_mib: int) -> None:
        opts = rocksdict.Options(raw_mode=True)
        opts.create_if_missing(True)
        opts.set_write_buffer_size(cache_mib // 4 * MIB)
        table = rocksdict.BlockBasedOptions()
        table.set_block_cache(rocksdict.Cache(cache_mib // 2 * MIB))
        table.set_bloom_filter(10, False)
        opts.set_block_based_table_factory(table)
        self.db = rocksdict.Rdict(str(path), opts)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k, v in items:
            batch.put(k, v)
        self.db.write(batch)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self.db.get(keys)

    def delete_many(self, keys: list[bytes]) -> None:
        batch = rocksdict.WriteBatch(raw_mode=True)
        for k in keys:
            batch.delete(k)
        self.db.write(batch)

    def close(self) -> None:
        self.db.close()


class _Lmdb:
    def __init__(self, path: Path, cache_mib: int) -> None:
        del cache_mib  # LMDB's memory is the page cache's: no setting bounds it
        self.env = lmdb.open(str(path), map_size=64 << 30, writemap=False, readahead=False)

    def put_many(self, items: list[tuple[bytes, bytes]]) -> None:
        with self.env.begin(write=True) as txn:
            txn.cursor().putmulti(items)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        with self.env.begin(buffers=False) as txn:
            return [txn.get(k) for k in keys]

    def delete_many(self, keys: list[bytes]) -> None:
        with self.env.begin(write=True) as txn:
            for k in keys:
                txn.delete(k)

    def close(self) -> None:
        self.env.close()


def _run(name: str, make: Callable[[Path], object], ids: int, root: Path) -> dict[str, float]:
    path = root / name
    keys = [f"i-13-{i}".encode() for i in range(ids)]
    rng = random.Random(13)
    probes = rng.sample(keys, ids // 10) + [f"i-14-{i}".encode() for i in range(ids // 10)]
    rng.shuffle(probes)
    segment = os.urandom(SEGMENT)
    segments = [f"r202601010000/{i:08d}".encode() for i in range(ids // 50_000)]
    gc.collect()
    anon0, file0 = _rss()
    store = make(path)
    t = time.perf_counter()
    for first in range(0, ids, BATCH):
        chunk = keys[first : first + BATCH]
        store.put_many([(k, PACK.pack(i)) for i, k in enumerate(chunk, first)])
    for s in segments:
        store.put_many([(s, segment)])
    put_s = time.perf_counter() - t
    disk = _disk(path)
    t = time.perf_counter()
    found = 0
    for first in range(0, len(probes), 1000):
        found += sum(v is not None for v in store.get_many(probes[first : first + 1000]))
    get_s = time.perf_counter() - t
    assert found == ids // 10, f"{name} found {found} of {ids // 10}"
    anon, file = _rss()
    t = time.perf_counter()
    for first in range(0, ids, BATCH):
        store.delete_many(keys[first : first + BATCH])
    store.delete_many(segments)
    delete_s = time.perf_counter() - t
    store.close()
    shutil.rmtree(path)
    figures = {
        "puts_per_s": ids / put_s,
        "lookups_per_s": len(probes) / get_s,
        "deletes_per_s": ids / delete_s,
        "rss_anon_mib": (anon - anon0) / MIB,
        "rss_file_mib": (file - file0) / MIB,
        "disk_mib": disk / MIB,
    }
    print(f"{name}: " + ", ".join(f"{k} {v:,.0f}" for k, v in figures.items()))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ids", type=int, default=4_000_000)
    parser.add_argument("--cache-mib", type=int, default=256)
    args = parser.parse_args()
    print(hardware_line())
    with tempfile.TemporaryDirectory(prefix="spill-store-", dir="/var/tmp") as tmp:
        stores = {
            "rocksdb": lambda p: _Rocks(p, args.cache_mib),
            "lmdb": lambda p: _Lmdb(p, args.cache_mib),
        }
        results = {name: _run(name, make, args.ids, Path(tmp)) for name, make in stores.items()}
    for name, figures in results.items():
        for figure, value in figures.items():
            print(f"RESULT spill_{name}_{figure} {value:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
