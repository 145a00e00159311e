"""The ``sandbox`` section: where and under which limits model-written code runs (the ``python`` tool, the
``swe`` environment's test runs; :mod:`reinforge.sandbox`, docs/agents.md#threat-model).

Its keys were ``agent.python_*`` and ``agent.max_concurrent_sandboxes`` until issue 54; those spellings are
still read, with a warning naming the new key (``config/loader.py``: ``MOVED_KEYS``). A sandbox's time limit
is the agent's ``agent.tool_timeout``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .fields import ConfigError, Section, opt


@dataclass
class SandboxConfig(Section):
    """The sandboxes of a run's model-written code (the `python` tool, the `swe` environment's tests):
    bubblewrap, never root on the host, per-process limits (see [agents.md](agents.md#threat-model)); each
    run of it lasts at most `agent.tool_timeout` seconds. These keys were the agent's (`agent.python_sandbox`,
    `agent.python_memory_mb`, `agent.python_max_open_files`, `agent.python_sandbox_uid`,
    `agent.python_sandbox_uids`, `agent.max_concurrent_sandboxes`): the old spellings are still read, with
    a warning."""

    name = "sandbox"
    backend: Literal["bwrap", "none"] = opt(
        "bwrap",
        "isolation: `bwrap` (a bubblewrap sandbox; the `python` tool refuses to start without it) or "
        "`none` (unsafe: a plain subprocess that can read and change your files)",
    )
    memory_mb: int = opt(
        1024,
        "address-space limit of each process of a sandbox (MiB); with its 64 MiB scratch disk, the memory of the "
        "whole sandbox",
        ge=64,
    )
    max_open_files: int = opt(
        1024, "descriptors each process of a sandbox may hold open at once (`RLIMIT_NOFILE`)", ge=16
    )
    uid: int = opt(
        990000,
        "the host uid and gid a sandbox runs as when the trainer is root (the trainer drops to it before "
        "bubblewrap starts, so nothing inside is root on the host); pick one no account or other service uses",
        ge=1,
        lt=2**32 - 1,
    )
    num_uids: int = opt(
        1024,
        "trainer run as root: sandboxes running at once each take a host uid (and gid) of their own among "
        "`sandbox.uid` .. `sandbox.uid` + this - 1, so that per-uid kernel quotas (inotify instances, keys, "
        "message queues, processes) are not shared; one uid for all: 1 ([agents.md](agents.md#threat-model))",
        ge=1,
    )
    max_concurrent: int | None = opt(
        None,
        "sandboxes running at once across all samples (a call waits for a slot before its time limit starts); "
        "`null`: half the memory available at start / (`sandbox.memory_mb` + 64 MiB of disk)",
        ge=1,
    )

    def check(self) -> None:
        if self.uid + self.num_uids > 2**32 - 1:
            raise ConfigError(
                f"sandbox.uid={self.uid} + sandbox.num_uids={self.num_uids} passes the last uid (2**32 - 2): "
                f"lower either"
            )
