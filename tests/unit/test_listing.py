"""Every listing of the on-disk layout takes only names that parse as what it lists: a
writer killed after its donefile was written inside its temporary directory, and before
the rename, leaves a directory that looks complete, and no listing may read it as what it
was going to become. Each leftover here is made by a real process killed with SIGKILL at
that moment. The leftovers are counted (``streamrec status``) and removed when their
writer is known to be gone, or after a grace period."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
from killed_writer import killed_writer

from ops.retention import _raw_exports, leftovers
from ops.status import format_leftovers, leftover_summary
from serving_export.artifact import _parent, version_listing
from streaming.slices import (
    builder_leftovers,
    latest_slice,
    slice_listing,
    slice_partitions,
    slice_pass_ids,
    write_slice,
)
from streamrec.atomic_fs import (
    is_temp_name,
    leftover_reason,
    remove_leftovers,
    temp_dir_for,
    writer_gone,
)
from streamrec.config import PathConfig, derived, load_config
from streamrec.layout import Layout
from streamrec.listing import list_folder
from streamrec.passes import (
    EventCounts,
    PassClock,
    complete_passes,
    is_pass_keyed,
    pass_dir,
    pass_listing,
    pass_state,
    slice_dir,
)
from trainers.checkpoints import (
    CHECKPOINT_MANIFEST,
    CheckpointInfo,
    checkpoint_listing,
    list_checkpoints,
    write_info,
)
from trainers.leftovers import cluster_leftovers, run_listing

ROOT = Path(__file__).resolve().parents[2]
P0, P1 = "202607010000", "202607010010"
GRACE_S = 3600.0


def _temporaries(folder: Path) -> tuple[Path, ...]:
    """The writers' temporaries in ``folder``, as a listing gives them."""
    return list_folder(folder, bool, directories=False).leftovers


def _complete_pass(data: Path, pass_id: str) -> Path:
    directory = pass_dir(data, pass_id)
    directory.mkdir(parents=True)
    (directory / "_manifest.json").write_text("{}")
    (directory / "_SUCCESS").touch()
    return directory


def test_a_killed_pass_writers_leftover_is_no_pass(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _complete_pass(data, P0)
    leftover = killed_writer(pass_dir(data, P1), "_manifest.json", "_SUCCESS")
    assert complete_passes(data) == [P0]  # it was '.202607010010.tmp-...' before the fix
    assert pass_listing(data).leftovers == (leftover,)
    assert pass_state(data, P1)[0] == "pending"  # listed, it failed on its name
    assert writer_gone(leftover)
    removed = remove_leftovers(builder_leftovers(data).leftovers, GRACE_S)
    assert [(r.path, r.why) for r in removed] == [(leftover, "its writer is no longer running")]
    assert not leftover.exists() and complete_passes(data) == [P0]


def _slice(data: Path, window: str, partition: int) -> None:
    table = pa.table({"event_id": [f"{window}-0"], "label": [0]})
    fields = {"offsets": {}, "resume_offsets": {}, "consumed_to": {}, "counts": EventCounts()}
    write_slice(data, 1, window, partition, table, 1, fields)


def test_a_killed_slice_writers_leftover_is_no_slice(tmp_path: Path) -> None:
    data = tmp_path / "data"
    _slice(data, P0, 0)
    leftover = killed_writer(slice_dir(data, P1, 1), "_slice.json", "_SUCCESS")
    (Layout.of(PathConfig.under(tmp_path)).data.latest_slice_index(0)).unlink()  # full scan
    assert latest_slice(data, 0, PassClock(600)).pass_id == P0
    assert latest_slice(data, 1, PassClock(600)) is None
    assert slice_partitions(data) == {0}
    assert slice_listing(data).names == (f"{P0}/p0",)
    assert slice_listing(data).leftovers == builder_leftovers(data).leftovers == (leftover,)
    assert slice_pass_ids(data) == {P0, P1}  # a window being written has a folder
    assert pass_state(data, P1)[0] == "pending"


def test_a_killed_savers_leftover_is_no_checkpoint(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    info = CheckpointInfo(pass_id=P0, kind="base", seq=0, parent=None, table_keys=0, saved_keys=0)
    (root / info.name).mkdir(parents=True)
    write_info(root / info.name, info)
    later = info.model_copy(update={"pass_id": P1, "seq": 1})
    leftover = killed_writer(root / later.name, CHECKPOINT_MANIFEST)
    write_info(leftover, later)  # complete as a save, but never renamed
    assert [i.name for i in list_checkpoints(root)] == [info.name]
    assert checkpoint_listing(root).leftovers == (leftover,)


def test_a_killed_exporters_leftover_is_no_export_and_retention_keeps_it(tmp_path: Path) -> None:
    cfg = derived(
        load_config(ROOT / "configs" / "pipeline.yaml"),
        "the test's folders",
        paths=PathConfig.under(tmp_path),
    )
    layout = Layout.of(cfg.paths)
    for command in ("a1", "b2"):
        layout.export_dir(P0, command).mkdir(parents=True)
    # a live exporter's temporary: retention took it for a superseded export before
    live = temp_dir_for(layout.export_dir(P1, "c3"))
    (live / "_SUCCESS").touch()
    leftover = killed_writer(layout.scores_dir(P1, "d4"), "_SUCCESS")
    assert run_listing(layout.exports).names == (f"{P0}-a1", f"{P0}-b2")
    assert [Path(d.target).name for d in _raw_exports(cfg)] == [f"{P0}-a1"]
    assert set(cluster_leftovers(cfg.paths).leftovers) == {live, leftover}
    assert set(leftovers(cfg)) == {live, leftover}
    summary = leftover_summary(cfg)
    assert summary["count"] == 2
    gone = {Path(x["path"]): x["writer_gone"] for x in summary["leftovers"]}
    assert gone == {live: False, leftover: True}
    text = format_leftovers(summary)
    assert f"{layout.exports}: 1" in text and f"{layout.scores}: 1" in text
    assert "writer gone" in text and "writer may be running" in text


def test_a_killed_packagers_leftover_is_no_version(tmp_path: Path) -> None:
    model_dir = tmp_path / "models" / "ctr"
    (model_dir / P0).mkdir(parents=True)
    leftover = killed_writer(model_dir / P1, "MANIFEST.json")
    assert version_listing(model_dir).names == (P0,)
    assert version_listing(model_dir).leftovers == (leftover,)
    assert _parent(model_dir, "202607010020", ("x",)) is None  # P0 has no manifest: no parent


def test_the_names_each_folder_holds() -> None:
    assert is_pass_keyed(f"{P0}-base") and is_pass_keyed(f"{P0}-0a1b2c3d4e5f")
    assert not is_pass_keyed(P0) and not is_pass_keyed(f"{P0}-") and not is_pass_keyed("x-base")
    assert not is_pass_keyed("202613010000-base")  # month 13
    assert is_temp_name(f".{P0}.tmp-1.2@host-0a1b2c3d") and is_temp_name(f".{P0}.tmp-x")
    assert not is_temp_name(P0) and not is_temp_name(".streamrec-storage.json")


def test_a_leftover_goes_at_once_only_when_its_writer_is_known_gone(tmp_path: Path) -> None:
    """A live writer's temporary stays, however old; one of another host (or named before
    owners were) only after the grace; one whose writer ran here and died, at once."""
    final = tmp_path / P0
    mine = temp_dir_for(final)  # this process: alive
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        theirs = mine.with_name(mine.name.replace(f"{os.getpid()}.", f"{sleeper.pid}.", 1))
        theirs.mkdir()
        elsewhere = tmp_path / f".{P0}.tmp-{sleeper.pid}.1@another-host-0a1b2c3d"
        unowned = tmp_path / f".{P0}.tmp-0a1b2c3d"
        for d in (elsewhere, unowned):
            d.mkdir()
        dead = killed_writer(final, "_SUCCESS")
        assert [writer_gone(p) for p in (mine, theirs, elsewhere, unowned, dead)] == [
            False,
            False,
            False,
            False,
            True,
        ]
        assert leftover_reason(unowned, GRACE_S) is None
        old = time.time() - GRACE_S - 1
        os.utime(unowned, (old, old))
        assert leftover_reason(unowned, GRACE_S) == f"unchanged for over {GRACE_S:g} s"
        (elsewhere / "part").write_text("x")  # written deep inside: a save still going
        os.utime(elsewhere, (old, old))
        assert leftover_reason(elsewhere, GRACE_S) is None
        removed = {r.path for r in remove_leftovers(_temporaries(tmp_path), GRACE_S)}
        assert removed == {unowned, dead}
        assert all(p.exists() for p in (mine, theirs, elsewhere))
        sleeper.kill()  # not reaped yet: a zombie, which kill(pid, 0) still finds
        deadline = time.monotonic() + 10
        while not writer_gone(theirs):
            assert time.monotonic() < deadline, "a killed, unreaped writer counts as running"
            time.sleep(0.01)
        assert Path(f"/proc/{sleeper.pid}").exists()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_leftover_file_goes_after_the_grace(tmp_path: Path) -> None:
    """A file's temporary (``write_text_atomic``) beside the folders is removed by age."""
    young, stale = tmp_path / ".p0.json.tmp-0a1b2c3d", tmp_path / ".p1.json.tmp-0a1b2c3d"
    for p in (young, stale):
        p.write_text("{}")
    old = time.time() - GRACE_S - 1
    os.utime(stale, (old, old))
    assert [r.path for r in remove_leftovers(_temporaries(tmp_path), GRACE_S)] == [stale]
    assert young.exists()
