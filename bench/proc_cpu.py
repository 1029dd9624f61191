"""CPU seconds of a process from /proc, shared by the benches that split CPU per process (driver, JVM,
Python workers, the OpenSearch-compatible server): steadier than wall time on a shared machine."""

import os

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """CPU seconds of a process and of its children that have exited (reaped); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(v) for v in fields[11:15]) / _CLOCK_TICKS  # utime, stime, cutime, cstime


def children() -> dict[int, list[int]]:
    """Parent pid -> its child pids, from /proc (processes that vanish while read are skipped)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            tree.setdefault(parent, []).append(int(entry))
    return tree


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (children, grandchildren, ...)."""
    tree = children()
    found, stack = [], list(tree.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack += tree.get(pid, [])
    return found
