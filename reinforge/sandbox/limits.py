"""What one sandbox run may use and what it did: :class:`SandboxLimits`, :class:`SandboxResult`, and the
bound on sandboxes running at once (:class:`SandboxSlots`, ``sandbox.max_concurrent``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .prelude import NETWORK_DENIED

DEFAULT_SANDBOX_UID = 990_000  # = sandbox.uid's default (the sandbox sits below config: a test keeps them equal)
DEFAULT_SANDBOX_UIDS = 1024  # = sandbox.num_uids' default
DEFAULT_MAX_OPEN_FILES = 1024  # = sandbox.max_open_files' default


@dataclass
class SandboxLimits:
    """Limits of one run: wall-clock ``timeout`` (seconds); ``memory_mb`` (MiB: the address space
    of each process, and with ``disk_mb`` the memory of the whole group); ``file_size_mb`` (MiB,
    the largest file written); ``disk_mb`` (MiB, all files written together, ``/dev/shm`` and
    ``/tmp`` included); ``max_processes`` (processes and threads at once); ``max_open_files``
    (``RLIMIT_NOFILE`` of each process: descriptors open at once); ``max_output_bytes`` captured per
    stream; ``sandbox_uid`` and ``sandbox_uids`` (when the trainer is root, each sandbox running at
    once takes a host uid and gid of its own among ``sandbox_uid .. sandbox_uid + sandbox_uids - 1``:
    :func:`.isolation.lease_uid`)."""

    timeout: float = 10.0
    memory_mb: int = 1024
    file_size_mb: int = 16
    disk_mb: int = 64
    max_processes: int = 64
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    max_output_bytes: int = 65536
    sandbox_uid: int = DEFAULT_SANDBOX_UID
    sandbox_uids: int = DEFAULT_SANDBOX_UIDS


@dataclass
class SandboxResult:
    """What a run did: its output (decoded, capped), exit status (None when killed at the time
    limit; 128 + the signal number when the program was killed by a signal), whether it timed out,
    its wall-clock ``seconds``, processes the kernel killed at the group's memory limit
    (``oom_kills``), ``infra_error``: a message when the sandbox itself failed to start (the
    process could not be made, the launcher or bubblewrap failed, or the program had not started
    when the time limit was reached; never the program's doing), else None, and ``start_ms``: the
    milliseconds from the run's launch (cgroup and arguments included) to the program's first line,
    None when it never started."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    seconds: float
    oom_kills: int = 0
    infra_error: str | None = None
    start_ms: float | None = None

    @property
    def out_of_memory(self) -> bool:
        return self.oom_kills > 0 or "MemoryError" in self.stderr

    @property
    def network_denied(self) -> bool:
        """The program failed with the sandbox's network message. This is read from the program's
        own output (which it could forge): a label for the model and the metrics, never a decision
        about safety (the empty network namespace is what holds)."""
        return self.returncode not in (0, None) and NETWORK_DENIED in self.stderr


def default_max_sandboxes(limits: SandboxLimits) -> int:
    """Sandboxes at once when ``sandbox.max_concurrent`` is null: half the memory the
    machine has available now (``MemAvailable``) divided by one sandbox's memory limit
    (``memory_mb + disk_mb``), at least 1."""
    try:
        with open("/proc/meminfo") as f:
            avail_kb = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return 1
    return max(1, avail_kb * 1024 // 2 // ((limits.memory_mb + limits.disk_mb) * 2**20))


class SandboxSlots:
    """The bound on sandboxes running at once, across every sample and tool call of a run
    (``sandbox.max_concurrent``). A call waits for a slot before its time limit starts.
    One semaphore per event loop (asyncio primitives belong to one loop; a run has one)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._sems: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Semaphore]] = {}

    def _sem(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        held = self._sems.get(id(loop))
        if held is None or held[0] is not loop:
            # each rollout runs its own event loop: forget the closed ones (and their semaphores)
            self._sems = {k: h for k, h in self._sems.items() if not h[0].is_closed()}
            held = self._sems[id(loop)] = (loop, asyncio.Semaphore(self.limit))
        return held[1]

    async def __aenter__(self) -> None:
        await self._sem().acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._sem().release()
