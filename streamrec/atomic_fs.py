"""The one filesystem adapter for commit points: write to a temporary name, fsync, rename.

A reader sees either the old file (or directory) or the new one, never a half-written one.

A temporary is named for what it becomes and for its writer::

    .<final name>.tmp-<pid>.<pid namespace>@<host>-<random>

so that a crashed writer's leftover can be told from a live writer's work: one whose
writer ran on this host, in this pid namespace, under a pid that no longer runs is a
leftover at once; any other only once it has not changed for a grace period
(``remove_leftovers``). Names without an owner (written before it was part of the name)
go by age alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TEMP_MARK = ".tmp-"
_OWNER = re.compile(r"(?P<pid>\d+)\.(?P<ns>\d+)@(?P<host>[A-Za-z0-9.-]+)-[0-9a-f]{8}")
_HOST = re.compile(r"[^A-Za-z0-9.-]")


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


def _pid_namespace() -> int:
    """The inode of this process's pid namespace (0 where /proc does not say): two
    containers on one host may share its name but not their pids."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _host() -> str:
    return _HOST.sub("_", socket.gethostname()) or "unknown"


def temp_path_for(final: Path) -> Path:
    """A fresh temporary name beside ``final``, naming this process as its writer."""
    owner = f"{os.getpid()}.{_pid_namespace()}@{_host()}-{uuid.uuid4().hex[:8]}"
    return final.with_name(f".{final.name}{TEMP_MARK}{owner}")


def is_temp_name(name: str) -> bool:
    """Whether ``name`` is a writer's temporary (live, or left by a crash)."""
    return name.startswith(".") and TEMP_MARK in name


def write_bytes_atomic(path: Path, data: bytes) -> Path:
    """Atomically replace ``path`` with ``data``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_for(path)
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
    tmp = temp_path_for(final)
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


def writer_gone(path: Path) -> bool:
    """True when the temporary ``path`` names a writer that ran on this host, in this pid
    namespace, and no longer runs: nobody will finish it."""
    found = _OWNER.search(path.name.partition(TEMP_MARK)[2])
    if found is None or found["host"] != _host():
        return False
    ns = _pid_namespace()
    if ns == 0 or int(found["ns"]) != ns:
        return False
    pid = int(found["pid"])
    return pid != os.getpid() and not _running(pid)


def _running(pid: int) -> bool:
    """Whether ``pid`` runs: exists and is no zombie (a killed process whose parent has
    not reaped it yet, which ``kill(pid, 0)`` still finds)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc to read: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's
            return True
        return True
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


def _unchanged_for(path: Path, now: float) -> float:
    """Seconds since anything inside ``path`` last changed (a save writes deep inside)."""
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                try:
                    newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                except FileNotFoundError:
                    continue
    return now - newest


def leftover_reason(path: Path, grace_s: float, now: float | None = None) -> str | None:
    """Why the temporary ``path`` is a leftover no writer will finish: its writer is gone
    (``writer_gone``), or nothing in it changed for ``grace_s`` seconds (a writer elsewhere:
    no live write takes that long); None while a writer may still own it."""
    if writer_gone(path):
        return "its writer is no longer running"
    if _unchanged_for(path, time.time() if now is None else now) >= grace_s:
        return f"unchanged for over {grace_s:g} s"
    return None


def remove_path(path: Path) -> None:
    """Delete a file or a directory tree; nothing if it is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Removed:
    """A leftover ``remove_leftovers`` deleted, and why it was safe to."""

    path: Path
    why: str


def remove_leftovers(leftovers: Iterable[Path], grace_s: float) -> list[Removed]:
    """Delete the temporaries among ``leftovers`` (a listing's) that no writer will finish
    (``leftover_reason``); what it deleted."""
    removed = []
    for p in leftovers:
        try:
            why = leftover_reason(p, grace_s)
        except FileNotFoundError:  # published or removed while we looked
            continue
        if why is not None:
            remove_path(p)
            removed.append(Removed(p, why))
    return removed
