"""Listing a folder of the layout: only the names that parse as what the folder holds.

A layout folder (``streamrec.layout``) holds entries named by a grammar: pass ids (a day's
passes, a model's versions), ``<pass_id>-<word>`` (a checkpoint save, a raw export, a
score run), ``p<N>`` (a partition's slice). Beside them may sit a writer's temporary
(``streamrec.atomic_fs``: live, or left by a crash) and strays nobody of ours wrote (an
operator's note, a marker file). A listing keeps the names and the temporaries, each
where it found them, and skips the rest, so a crashed writer's leftover is never read as
what it was going to become. The grammars are their owners'; each owner lists its
folder through ``list_folder``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from streamrec.atomic_fs import is_temp_name


@dataclass(frozen=True)
class Listing:
    """What one or more layout folders hold: the names that parse, and the writers'
    temporaries, each where it was found (anything else is skipped)."""

    names: tuple[str, ...] = ()
    leftovers: tuple[Path, ...] = ()

    @classmethod
    def joined(cls, listings: Iterable[Listing]) -> Listing:
        """The listings of several folders as one (names sorted)."""
        listings = list(listings)
        names = sorted(name for listing in listings for name in listing.names)
        return cls(tuple(names), tuple(p for listing in listings for p in listing.leftovers))


def list_folder(
    folder: Path, accepts: Callable[[str], bool], *, directories: bool = True
) -> Listing:
    """The entries of ``folder`` whose name ``accepts`` (directories only, unless told),
    sorted, and its writers' temporaries. A missing folder lists nothing."""
    folder = Path(folder)
    if not folder.is_dir():
        return Listing()
    names, leftovers = [], []
    for entry in folder.iterdir():
        if is_temp_name(entry.name):
            leftovers.append(entry)
        elif accepts(entry.name) and (not directories or entry.is_dir()):
            names.append(entry.name)
    return Listing(tuple(sorted(names)), tuple(sorted(leftovers)))
