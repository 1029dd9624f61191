"""Small JSON files of named entries under ``$DAGSTER_HOME/icecdc`` that several processes share
(the daemon's lanes, ``icecdc`` commands, the code server): read without a lock, changed under an
exclusive ``flock`` and replaced atomically, so a reader never sees half a file."""

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["read", "update"]


def read(path: Path) -> dict[str, Any]:
    """The file's entries; a missing or unreadable file (another version's) is empty."""
    try:
        entries = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return entries if isinstance(entries, dict) else {}


def update(path: Path, name: str, change: Callable[[dict[str, Any]], bool]) -> bool:
    """Let ``change`` edit the entry ``name`` (a dict; empty when absent) under the file's lock. It
    returns False when it changed nothing, and nothing is written then. True: the file was rewritten."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entries = read(path)
        found = entries.get(name)
        entry: dict[str, Any] = dict(found) if isinstance(found, dict) else {}
        if not change(entry):
            return False
        entries[name] = entry
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(temporary, path)
    return True
