"""The one filesystem adapter for commit points: write to a temporary name, fsync, rename.

A reader sees either the old file (or directory) or the new one, never a half-written one.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
import uuid
from pathlib import Path


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or create inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Atomically replace ``path`` with ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return path


def write_text_atomic(path: Path, text: str) -> Path:
    """Atomically replace ``path`` with ``text`` (UTF-8)."""
    return write_bytes_atomic(path, text.encode())


def temp_dir_for(final: Path) -> Path:
    """A fresh sibling directory of ``final`` to build its content in before ``publish_dir``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    return tmp


def publish_dir(tmp: Path, final: Path) -> Path:
    """Fsync every file in ``tmp`` and rename it to ``final`` (which must not exist)."""
    for root, _dirs, files in os.walk(tmp):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    return final


def remove_stale_temps(parent: Path, older_than_s: float = 0) -> int:
    """Delete leftovers of crashed writers (``.<name>.tmp-*``) directly under ``parent`` that
    are older than ``older_than_s`` (another live writer may own a newer one); return count."""
    if not parent.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    stale = [
        p
        for p in parent.iterdir()
        if p.name.startswith(".") and ".tmp-" in p.name and p.lstat().st_mtime <= cutoff
    ]
    for p in stale:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
    return len(stale)
