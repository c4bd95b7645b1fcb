"""A writer's leftover made the way a crash makes it: a real process builds the temporary
directory of a layout entry (``streamrec.atomic_fs.temp_dir_for``), writes files into it
(the donefile last) and is SIGKILLed before the rename that would publish it."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

_WRITER = """
import os, signal, sys
from pathlib import Path
from streamrec.atomic_fs import temp_dir_for
tmp = temp_dir_for(Path(sys.argv[1]))
for name in sys.argv[2:]:
    (tmp / name).write_text("{}")
print(tmp, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def killed_writer(final: Path, *files: str) -> Path:
    """The temporary a writer of ``final`` leaves when SIGKILLed after writing ``files``
    into it and before renaming it."""
    done = subprocess.run(
        [sys.executable, "-c", _WRITER, str(final), *files],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr
    leftover = Path(done.stdout.strip())
    assert leftover.parent == final.parent and all((leftover / f).is_file() for f in files)
    return leftover
