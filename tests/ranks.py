"""Run a function on several spawned ranks and take rank 0's result, failing (never hanging) when a
rank dies or a collective is never matched."""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
import time

from reinforge.utils.net import free_port


def spawn_ranks(target, world: int, args: tuple, timeout: float = 240.0):
    """Start ``target(rank, world, port, *args, queue)`` on ``world`` spawned processes; rank 0 puts
    its result on ``queue``. Returns that result once every rank exited 0.

    Raises:
        AssertionError: a rank exited non-zero, or the ranks were still running after ``timeout`` s
            (they are killed).
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, q)) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    result, got = None, False
    try:
        while not got and time.monotonic() < deadline:
            try:
                result, got = q.get(timeout=1.0), True
            except queue_mod.Empty:
                failed = [(i, p.exitcode) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
                assert not failed, f"rank(s) died before rank 0 reported: (rank, exit code) {failed}"
        assert got, f"no result from rank 0 after {timeout} s: a collective was not matched"
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        alive = [i for i, p in enumerate(procs) if p.is_alive()]
        assert not alive, f"ranks {alive} still running after {timeout} s: a collective was not matched"
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
        return result
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
