"""``streamrec cluster``: this host's members of the cluster (``trainers.launcher``), and
with ``cluster.follow_passes`` the pass follower beside them (``ops.pass_follower``)."""

from __future__ import annotations

import argparse

from ops.pass_follower import following
from trainers import launcher


def parser() -> argparse.ArgumentParser:
    """The command's arguments (``trainers.launcher``'s)."""
    return launcher.parser()


def main(argv: list[str] | None = None) -> int:
    """``streamrec cluster`` with the pass follower on every node (one leads)."""
    return launcher.main(argv, beside=following)
