"""What a cluster member killed mid-write leaves on disk: a save, a raw export or a score
run under its temporary name. Listed for ``streamrec status`` and retention, and removed
by worker 0 when the cluster starts (``streamrec.atomic_fs.remove_leftovers``)."""

from __future__ import annotations

from pathlib import Path

from streamrec.config import PathConfig
from streamrec.layout import Layout
from streamrec.listing import Listing, list_folder
from streamrec.passes import is_pass_keyed
from trainers.checkpoints import checkpoint_listing


def run_listing(folder: Path) -> Listing:
    """The runs (``<pass_id>-<command>``) of a raw-export or scores folder."""
    return list_folder(folder, is_pass_keyed)


def cluster_leftovers(paths: PathConfig) -> Listing:
    """The writers' temporaries among the saves, raw exports and score runs."""
    layout = Layout.of(paths)
    return Listing.joined(
        [
            Listing((), checkpoint_listing(Path(paths.checkpoint_root)).leftovers),
            Listing((), run_listing(layout.exports).leftovers),
            Listing((), run_listing(layout.scores).leftovers),
        ]
    )
