"""Limits on a whole group of processes: a control group (cgroup) per sandbox run.

Resource limits (``setrlimit``) hold per process: three children of a program may each use the
memory limit. A cgroup bounds the sum over every process in it and its descendants:

* memory (``memory.max`` in cgroup v2, ``memory.limit_in_bytes`` in v1), swap included, in bytes;
  at the limit the kernel's OOM killer kills a process of the group (``oom_kills`` counts them);
* the number of processes and threads (``pids.max``);
* CPU bandwidth (``cpu.max`` / ``cpu.cfs_quota_us``), in CPUs: with a wall-clock limit of ``t``
  seconds the group's CPU time is at most ``cpus * t``.

A cgroup is made under the caller's own one (so its limits still apply) in the unified (v2)
hierarchy when it offers the memory and pids controllers there, else in the v1 hierarchies of
``memory``, ``pids`` and ``cpu``. Making one needs write access to those folders (root, or a
delegated subtree); :func:`create_cgroup` raises ``OSError`` saying why when it cannot.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_counter = itertools.count()
_swept: list[bool] = []  # remove_stale ran in this process
PREFIX = "reinforge-sandbox-"  # + trainer pid + "-" + counter
_CPU_PERIOD_US = 100_000


@dataclass
class Cgroup:
    """One cgroup: its folder per hierarchy (one in v2; memory, pids and cpu in v1)."""

    dirs: list[Path]
    version: int

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files a process writes its pid into to join (every hierarchy)."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def pids(self) -> set[int]:
        """Processes in the group now."""
        out: set[int] = set()
        for f in self.procs_files:
            try:
                out.update(int(p) for p in Path(f).read_text().split())
            except OSError:
                pass
        return out

    def oom_kills(self) -> int:
        """Processes the kernel killed at the memory limit (``oom_kill`` of ``memory.events`` /
        ``memory.oom_control``)."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        for d in self.dirs:
            path = d / name
            if path.exists():
                for line in path.read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def kill(self) -> None:
        """SIGKILL every process in the group (repeated while new ones appear)."""
        kill_file = self.dirs[0] / "cgroup.kill"
        if self.version == 2 and kill_file.exists():
            try:
                kill_file.write_text("1")
                return
            except OSError:
                pass
        for _ in range(10):
            pids = self.pids()
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass

    def remove(self, wait: float = 2.0) -> bool:
        """Kill what is left and delete the folders (retried for ``wait`` seconds while dying
        processes leave). Returns whether every folder is gone."""
        deadline = time.monotonic() + wait
        left = list(self.dirs)
        while True:
            self.kill()
            for d in list(left):
                try:
                    d.rmdir()
                    left.remove(d)
                except FileNotFoundError:
                    left.remove(d)
                except OSError:
                    pass
            if not left or time.monotonic() > deadline:
                return not left
            time.sleep(0.01)


def create_cgroup(memory_bytes: int, max_pids: int, cpus: float) -> Cgroup:
    """A new cgroup with these limits, under the caller's own cgroup.

    Args:
        memory_bytes: memory of the whole group (swap included), bytes.
        max_pids: processes and threads in the group at once.
        cpus: CPU bandwidth (1.0 = one core).

    Raises:
        OSError: no writable cgroup hierarchy with these controllers (not Linux, no permission,
            a v2 parent with processes of its own); the message says which.
    """
    mounts = _cgroup_mounts()
    own = _own_cgroups()
    if not _swept:
        _swept.append(True)
        remove_stale(mounts, own)
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    reasons = []
    if "" in mounts:
        try:
            return _create_v2(Path(mounts[""]) / own.get("", "/").lstrip("/") / name, memory_bytes, max_pids, cpus)
        except OSError as e:
            reasons.append(f"cgroup v2: {e}")
    if all(c in mounts for c in ("memory", "pids")):
        try:
            return _create_v1(mounts, own, name, memory_bytes, max_pids, cpus)
        except OSError as e:
            reasons.append(f"cgroup v1: {e}")
    else:
        reasons.append("no cgroup v1 memory and pids hierarchies mounted")
    raise OSError("; ".join(reasons))


def remove_stale(mounts: dict[str, str] | None = None, own: dict[str, str] | None = None) -> list[Path]:
    """Remove the sandbox cgroups that a trainer which no longer runs left behind (it was killed
    with runs in flight): ``reinforge-sandbox-<pid>-<n>`` folders beside ours whose ``<pid>`` is
    gone. Their processes died with that trainer (parent-death signal); any left are killed.
    Called once per process, before the first cgroup is made. Returns the folders removed."""
    mounts = _cgroup_mounts() if mounts is None else mounts
    own = _own_cgroups() if own is None else own
    parents = {Path(root) / own.get(c, "/").lstrip("/") for c, root in mounts.items()}
    removed = []
    for parent in parents:
        try:
            entries = list(parent.glob(PREFIX + "*"))
        except OSError:
            continue
        for d in entries:
            pid = d.name[len(PREFIX) :].split("-")[0]
            if not pid.isdigit() or Path(f"/proc/{pid}").exists():
                continue
            stale = Cgroup([d], 2 if "" in mounts and str(parent).startswith(mounts[""]) else 1)
            if stale.remove(0.5):
                removed.append(d)
    return removed


def _create_v2(path: Path, memory_bytes: int, max_pids: int, cpus: float) -> Cgroup:
    parent = path.parent
    available = (parent / "cgroup.controllers").read_text().split()
    if not {"memory", "pids"} <= set(available):
        raise OSError(f"{parent} offers controllers {available}, not memory and pids")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    wanted = [c for c in ("memory", "pids", "cpu") if c in available and c not in enabled]
    if wanted:  # refused (EBUSY) when the parent holds processes itself and is not the root
        (parent / "cgroup.subtree_control").write_text(" ".join("+" + c for c in wanted))
    path.mkdir()
    cg = Cgroup([path], 2)
    try:
        _write(path / "memory.max", memory_bytes)
        _write(path / "memory.swap.max", 0, optional=True)
        _write(path / "pids.max", max_pids)
        _write(path / "cpu.max", f"{int(cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}", optional=True)
    except OSError:
        cg.remove(0)
        raise
    return cg


def _create_v1(
    mounts: dict[str, str], own: dict[str, str], name: str, memory_bytes: int, max_pids: int, cpus: float
) -> Cgroup:
    controllers = [c for c in ("memory", "pids", "cpu") if c in mounts]
    cg = Cgroup([], 1)
    try:
        for c in controllers:
            d = Path(mounts[c]) / own.get(c, "/").lstrip("/") / name
            d.mkdir()
            cg.dirs.append(d)
            if c == "memory":
                _write(d / "memory.limit_in_bytes", memory_bytes)
                _write(d / "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
            elif c == "pids":
                _write(d / "pids.max", max_pids)
            else:
                _write(d / "cpu.cfs_period_us", _CPU_PERIOD_US, optional=True)
                _write(d / "cpu.cfs_quota_us", int(cpus * _CPU_PERIOD_US), optional=True)
    except OSError:
        cg.remove(0)
        raise
    return cg


def _write(path: Path, value: object, optional: bool = False) -> None:
    if optional and not path.exists():
        return
    path.write_text(str(value))


def _cgroup_mounts() -> dict[str, str]:
    """Mount point per v1 controller, and ``""`` for the v2 hierarchy (from /proc/self/mounts)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        parts = line.split()
        if len(parts) < 4:
            continue
        where, kind, options = parts[1], parts[2], parts[3].split(",")
        if kind == "cgroup2":
            out.setdefault("", where)
        elif kind == "cgroup":
            for c in ("memory", "pids", "cpu"):
                if c in options:
                    out.setdefault(c, where)
    return out


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and ``""`` for v2 (from /proc/self/cgroup)."""
    out: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out
