"""Running model-written Python in an operating-system sandbox (bubblewrap).

How the sandbox is built, and what the program can and cannot reach, is in
:mod:`reinforge.sandbox.isolation` and docs/agents.md#threat-model. In short: nothing inside is
root anywhere (the trainer, if root, drops to the unprivileged ``sandbox.uid``
before ``bwrap`` makes the user namespace); every namespace is new; a seccomp filter denies the
kernel keyrings, ptrace, bpf, perf, io_uring, mounts and namespaces; the program sees the system
folders and the interpreter read-only, an empty ``/proc/cmdline``, and its own scratch ``tmpfs``;
pid 1 of the sandbox is an init of ours out of the program's reach (non-dumpable), which the host
kills from outside at the time limit; it dies with ``bwrap``, and ``bwrap`` dies with the trainer
(or with the trainer's launch server, :mod:`.launch_server`, which starts each run's launcher
without a new interpreter, and dies with the trainer). Sockets of families the network namespace
does not isolate (``AF_VSOCK``...) are refused.

Limits of one run (:class:`SandboxLimits`): of the whole group (a cgroup, :mod:`.cgroup`):
memory ``memory_mb + disk_mb`` (tmpfs pages are charged to it), ``max_processes``, one CPU; per
process: ``RLIMIT_AS`` = ``memory_mb`` (a large allocation raises ``MemoryError``),
``RLIMIT_FSIZE``, ``RLIMIT_CPU``, ``RLIMIT_NPROC`` (held per sandbox: it counts in the sandbox's
own user namespace, also where no cgroup can be made), ``RLIMIT_NOFILE`` = ``max_open_files``,
``RLIMIT_MSGQUEUE`` and ``RLIMIT_SIGPENDING`` (:data:`MSGQUEUE_BYTES`, :data:`SIGPENDING`), no core
dumps; per uid (a root trainer): a host uid of its own per sandbox running at once; all files together at most
``disk_mb`` (the tmpfs sizes); the wall-clock ``timeout`` kills the sandbox. How many sandboxes run
at once is bounded by :class:`SandboxSlots` (``sandbox.max_concurrent``).

Without bubblewrap (or where it cannot make namespaces, e.g. a container that forbids user
namespaces) the ``python`` tool refuses to start (:func:`check_sandbox`), unless the config opts
out with ``sandbox.backend=none``: a plain subprocess with the per-process limits only,
which does **not** contain hostile code.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import itertools
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..utils import stall
from . import launch_server
from .cgroup import Cgroup, create_cgroup
from .io import START_MARK, BwrapStatus, ServerRun, data_fd, kill_init, layers_of, merged_copy, read_capped, wait_exited
from .isolation import (
    BWRAP_ENV,
    SCRATCH,
    SandboxUnavailable,
    bwrap_args,
    bwrap_path,
    host_env,
    host_uid,
    launcher_args,
    launcher_command,
    lease_uid,
    overlay_option,
    sandbox_env,
    seccomp_program,
    staged_paths,
)
from .launch_server import LaunchError, ServerDied
from .limits import (  # noqa: F401 (re-exported)
    DEFAULT_MAX_OPEN_FILES,
    DEFAULT_SANDBOX_UID,
    DEFAULT_SANDBOX_UIDS,
    SandboxLimits,
    SandboxResult,
    SandboxSlots,
    default_max_sandboxes,
)
from .metrics import record
from .prelude import MSGQUEUE_BYTES, NETWORK_DENIED, PRELUDE, SIGPENDING  # noqa: F401 (the limits: re-exported)

if TYPE_CHECKING:
    from ..config.sandbox import SandboxConfig

log = logging.getLogger(__name__)

ISOLATIONS = ("bwrap", "none")
LAUNCHERS = ("server", "exec")
OPT_OUT = "sandbox.backend=none"

__all__ = [
    "ISOLATIONS",
    "START_MARK",
    "OPT_OUT",
    "SandboxLimits",
    "SandboxResult",
    "SandboxSlots",
    "SandboxUnavailable",
    "Sandboxes",
    "bwrap_path",
    "check_sandbox",
    "default_max_sandboxes",
    "run_python",
]


def check_sandbox(isolation: str = "bwrap", sandbox_uid: int = DEFAULT_SANDBOX_UID) -> None:
    """Check that runs with ``isolation`` can start (``bwrap``: installed, libseccomp present, and
    a trial sandbox runs as it will for the model's code; checked once per process, bubblewrap
    executable (:func:`bwrap_path`: ``$REINFORGE_BWRAP``, else ``bwrap`` on ``PATH``) and uid).

    Raises:
        SandboxUnavailable: what is missing, how to install it, and the opt-out key.
        ValueError: ``isolation`` is not one of ``bwrap``, ``none``.
    """
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox.backend: {isolation!r} is not one of {', '.join(ISOLATIONS)}")
    if isolation == "bwrap":
        problem = _bwrap_problem(bwrap_path(), sandbox_uid)
        if problem:
            raise SandboxUnavailable(
                f"the python tool runs model-written code in a bubblewrap sandbox, which {problem}. Install it "
                f"(`apt-get install bubblewrap libseccomp2`; `make setup` does it as root), or set "
                f"{OPT_OUT} to run that code without isolation (unsafe: it can read and change your files)."
            )


@functools.lru_cache(maxsize=8)
def _bwrap_problem(bwrap: str | None, sandbox_uid: int) -> str | None:
    if bwrap is None or not sys.platform.startswith("linux"):
        override = os.environ.get(BWRAP_ENV)
        if override:
            return f"is not found: ${BWRAP_ENV}={override!r} names no executable"
        return f"is not installed (no `bwrap` on PATH; ${BWRAP_ENV} may name its path)"
    try:
        seccomp_program()
    except SandboxUnavailable as e:
        return f"cannot filter system calls here: {e}"
    trial = run_python("print(6 * 7)", SandboxLimits(timeout=30, sandbox_uid=sandbox_uid), checked=True)
    with ThreadPoolExecutor(1) as pool:  # its own event loop: the caller may be inside one
        r = pool.submit(asyncio.run, trial).result()
    if r.infra_error or r.stdout.strip() != "42":
        lines = (r.infra_error or r.stderr).strip().splitlines()
        why = lines[-1].strip()[-300:] if lines else f"exit status {r.returncode}"  # one line: the error's last
        hint = (
            "user namespaces may be disabled, or root lacks CAP_SYS_ADMIN"
            if os.geteuid() == 0
            else "user namespaces may be disabled"
        )
        return f"fails here ({why}; {hint})"
    return None


def _group_limits(lim: SandboxLimits, sandboxes: Sandboxes) -> Cgroup | None:
    try:
        return create_cgroup((lim.memory_mb + lim.disk_mb) * 2**20, lim.max_processes, 1.0)
    except OSError as e:
        if "no_cgroup" not in sandboxes.warned:
            sandboxes.warned.add("no_cgroup")
            log.warning(
                "python tool: no cgroup could be made (%s); memory is limited per process and by the tmpfs "
                "sizes, processes per sandbox, CPU per process; not the sandbox's memory as a whole",
                e,
            )
        return None


async def run_python(
    code: str,
    limits: SandboxLimits | None = None,
    isolation: str = "bwrap",
    checked: bool = False,
    binds: dict[str, str | list[str]] | None = None,
    launcher: str = "server",
    sandboxes: Sandboxes | None = None,
) -> SandboxResult:
    """Run ``code`` as a Python program under ``limits`` (module docstring).

    Cancelling the coroutine (a caller's own timeout) kills the sandbox. Never raises for what
    the program does: failures are in the result (exit status, stderr, ``timed_out``,
    ``oom_kills``); a sandbox that could not start (its process could not be made, e.g. out of
    memory or processes; bubblewrap failed; the program had not started at the time limit) is
    ``infra_error``. Each run is reported to the episode's fleet metrics
    (:mod:`reinforge.sandbox.metrics`).

    Args:
        isolation: ``bwrap`` (the sandbox) or ``none`` (a plain subprocess: per-process limits
            only, unsafe; ``sandbox.backend=none``).
        checked: skip :func:`check_sandbox` (it calls this for its trial run).
        binds: host folders the program sees read-only in its working directory, ``{name: host
            path}`` (an episode's workspace: ``name/...``; it must be readable by the sandbox's uid),
            or ``{name: [host paths]}``: layers, bottom first, shown as one folder (a copy-on-write
            workspace: the later layers' files hide the earlier ones'; an overlay mount, or where
            none can be made here, a copy of the layers made for the run). Without isolation a
            folder is a symbolic link (the program can write there), layers a copy.
        launcher: ``server`` (the launch server forks the launcher: :mod:`.launch_server`; where
            none can run here, as ``exec``) or ``exec`` (a new interpreter runs the launcher).
        sandboxes: the run's :class:`Sandboxes` (its run numbers, overlay trials and one-time
            warnings); None: the process's (:data:`OUTSIDE_RUNS`: a test, a benchmark, a trial run).

    Raises:
        SandboxUnavailable: ``isolation="bwrap"`` and bubblewrap cannot run here.
        ValueError: a name of ``binds`` that is not a plain folder name, or a layer path an overlay
            cannot carry.
    """
    lim = limits or SandboxLimits()
    sandboxes = sandboxes or OUTSIDE_RUNS
    layers = layers_of(binds)
    if launcher not in LAUNCHERS:
        raise ValueError(f"run_python: launcher {launcher!r} is not one of {', '.join(LAUNCHERS)}")
    if not checked:
        check_sandbox(isolation, lim.sandbox_uid)
    start = time.perf_counter()
    proc = reads = cgroup = None
    started: list[float] = []  # when the prelude's START_MARK arrived
    fds: dict[str, int] = {}
    host_scratch = None
    copies: list[str] = []  # merged copies of layers made for this run
    status: BwrapStatus | None = None  # bwrap's status descriptor: the sandbox's pid 1
    lease: int | None = None  # the lock of the host uid this run holds (lease_uid)
    init: int | None = None  # a pidfd of the sandbox's pid 1, once killed from outside
    try:
        python = [
            sys.executable,
            "-I",
            "-S",
            "-c",
            PRELUDE,
            str(lim.memory_mb * 2**20),
            str(lim.file_size_mb * 2**20),
            str(max(1, int(lim.timeout) + 1)),
        ]
        if isolation == "bwrap":
            fds = {"program": data_fd(code.encode()), "seccomp": data_fd(seccomp_program()), "empty": data_fd(b"")}
            fds["status"], status_w = os.pipe()
            fds["status_w"] = status_w
            status = BwrapStatus(fds["status"])
            uid = host_uid(lim.sandbox_uid)
            if uid is not None:
                uid, lease = lease_uid(uid, lim.sandbox_uids)
            layered = any(len(ls) > 1 for ls in layers.values())
            if layered and not _overlay_trial.get() and not await sandboxes.overlays_work(lim.sandbox_uid):
                layers = {n: [merged_copy(ls, copies)] if len(ls) > 1 else ls for n, ls in layers.items()}
            stage_of = staged_paths(uid, tuple(p for ls in layers.values() for p in ls))
            overlays = [
                (stage_of.get(ls[-1], ls[-1]), overlay_option(ls, stage_of)) for ls in layers.values() if len(ls) > 1
            ]
            argv = [
                bwrap_path(),
                *bwrap_args(
                    lim.disk_mb, stage_of, {**fds, "status": status_w}, {n: ls[-1] for n, ls in layers.items()}
                ),
                "--",
                *python,
                str(lim.max_processes),
                str(lim.max_open_files),
                _site_packages(),
            ]
            cgroup = _group_limits(lim, sandboxes)
            procs = cgroup.procs_files if cgroup else []
            server = launch_server.server() if launcher == "server" else None
            if server is None:
                cmd = launcher_command(argv, procs, uid, stage_of, overlays)
            else:
                cmd = [*launcher_args(procs, uid, stage_of, 0, overlays), *argv]  # the server names the parent
            cwd, env, scratch = None, host_env(), SCRATCH
            pass_fds = (fds["program"], fds["seccomp"], fds["empty"], status_w)
        else:
            host_scratch = scratch = tempfile.mkdtemp(prefix="reinforge-sandbox-")
            with open(os.path.join(scratch, "main.py"), "w") as f:
                f.write(code)
            for name, ls in layers.items():
                if len(ls) > 1:
                    merged_copy(ls, [], os.path.join(scratch, name))
                else:
                    os.symlink(ls[0], os.path.join(scratch, name))
            cmd, cwd, env, pass_fds = (
                [*python, "0", str(lim.max_open_files), _site_packages()],
                scratch,
                sandbox_env(scratch),
                (),
            )
            env["PATH"] = os.environ.get("PATH", os.defpath)
            server = None
        try:
            if server is not None:
                proc = await ServerRun.start(server, cmd, list(pass_fds))
            else:
                proc = await asyncio.create_subprocess_exec(
                    *cmd,
                    cwd=cwd,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    pass_fds=pass_fds,
                )
        except (OSError, LaunchError, ServerDied) as e:  # no memory or processes left (the fleet's, not the program's)
            return _recorded(
                SandboxResult("", "", None, False, time.perf_counter() - start, 0, f"the process could not start: {e}")
            )
        for key in ("program", "seccomp", "empty", "status_w"):  # the child holds its copies
            if key in fds:
                os.close(fds.pop(key))
        reads = asyncio.ensure_future(
            asyncio.gather(
                read_capped(proc.stdout, lim.max_output_bytes),
                read_capped(proc.stderr, lim.max_output_bytes, tail=True, mark=started),
            )
        )
        timed_out = False
        with stall.busy("sandbox", f"sandbox {next(sandboxes.numbers)} (pid {proc.pid})"):  # the stall doctor's view
            try:
                await asyncio.wait_for(proc.wait(), lim.timeout)
            except TimeoutError:
                timed_out = True
                init = _kill(proc, cgroup, status)
                await proc.wait()
        if cgroup is not None:
            cgroup.kill()  # what the program left (the pid namespace is gone already under bwrap)
        try:  # a process left behind (only without bwrap) may hold the pipes open: do not wait for it
            out, err = await asyncio.wait_for(reads, 2.0)
        except TimeoutError:
            out, err = "", "(output lost: a background process kept the output open)"
        infra = getattr(proc, "died", None)  # the launch server died during the run: it took the program along
        if infra is None and status is not None and not timed_out and (status.init_pid is None or not started):
            infra = err.strip() or f"the sandbox exited with status {proc.returncode} before the program started"
        elif infra is None and timed_out and not started:
            infra = f"the program had not started after {lim.timeout:g} s (the time limit)"
        out, err = out.replace(scratch + os.sep, ""), err.replace(scratch + os.sep, "")
        return _recorded(
            SandboxResult(
                out,
                err,
                None if timed_out else proc.returncode,
                timed_out,
                time.perf_counter() - start,
                cgroup.oom_kills() if cgroup else 0,
                infra,
                (started[0] - start) * 1000 if started and not infra else None,
            )
        )
    finally:
        if proc is not None and proc.returncode is None:  # cancelled: do not leave it running
            init = _kill(proc, cgroup, status) or init
        if reads is not None and not reads.done():
            reads.cancel()
        if isinstance(proc, ServerRun):
            proc.close()
        elif proc is not None and proc._transport is not None:  # asyncio leaves it to the GC: a warning after the loop
            proc._transport.close()
        if cgroup is not None and not cgroup.remove():
            log.warning("python tool: cgroup %s could not be removed", cgroup.dirs)
        for fd in fds.values():
            os.close(fd)
        if host_scratch is not None:
            shutil.rmtree(host_scratch, ignore_errors=True)
        for d in copies:
            shutil.rmtree(d, ignore_errors=True)
        try:
            if init is not None:  # the uid is given back once its namespace is empty
                await wait_exited(init, 2.0)
        finally:
            if init is not None:
                os.close(init)
            if lease is not None:
                os.close(lease)


_overlay_trial: contextvars.ContextVar[bool] = contextvars.ContextVar("reinforge_overlay_trial", default=False)


def _recorded(r: SandboxResult) -> SandboxResult:
    """``r``, reported to the current episode's fleet metrics."""
    record(r.start_ms, r.infra_error is not None)
    return r


@functools.lru_cache(maxsize=1)
def _site_packages() -> str:
    """The interpreter's site-packages folders (``os.pathsep``-joined), in the prelude's ``sys.path``."""
    import site

    return os.pathsep.join(p for p in site.getsitepackages() if os.path.isdir(p))


def _kill(
    proc: asyncio.subprocess.Process | ServerRun, cgroup: Cgroup | None, status: BwrapStatus | None
) -> int | None:
    """Kill the whole sandbox, with or without a cgroup: first its pid 1 from outside (under bwrap:
    the pid namespace's init, whose death kills every process of the namespace), then ``proc`` (a
    launcher started per run: its process group; under bwrap, bwrap itself), then every process of
    the cgroup. Returns a pidfd of the pid 1 killed (the caller waits for it and closes it), or None."""
    init = None
    if status is not None and (pid := status.init_pid) is not None:
        init = kill_init(pid, proc.pid)
    if isinstance(proc, ServerRun):
        proc.kill()
    else:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if cgroup is not None:
        cgroup.kill()
    return init


def sandbox_problems(cfg: Any) -> list[str]:
    """The start-up check of the python tool's sandbox (``reinforge.preflight.check_rl``), when the run gives
    the model code to run (``python`` in ``agent.tools``, or ``agent.environment: swe``) in a sandbox
    (``sandbox.backend: bwrap``): a trial sandbox must run here (:func:`check_sandbox`: bubblewrap on
    ``PATH`` or ``$REINFORGE_BWRAP``, libseccomp, user namespaces), checked once per process; else one problem
    in one line saying what is wrong and what to do (issue 57: found at start, not as a traceback at the
    first rollout). ``cfg``: the root config."""
    a, s = cfg.agent, cfg.sandbox
    if s.backend == "none" or not ("python" in a.tools or a.environment == "swe"):
        return []
    try:
        check_sandbox(s.backend, s.uid)
    except SandboxUnavailable as e:
        return [str(e)]
    return []


class Sandboxes:
    """The sandboxes of one run, and what the run learns once for all of them. The agent loop makes
    one per run (:class:`reinforge.rollout.agent.Agent`, from the ``sandbox`` section:
    :meth:`from_config`); the ``python`` tool and an environment's test runs (``EnvContext.sandboxes``)
    run through it (:meth:`run`), so that they share:

    - ``limits`` and ``isolation``: the ``python`` tool's (``agent.tool_timeout``,
      ``sandbox.memory_mb``, ``max_open_files``, ``backend``, ``uid``, ``num_uids``);
    - ``slots``: the bound on sandboxes running at once (``sandbox.max_concurrent``; null:
      :func:`default_max_sandboxes`);
    - ``checked``: the (isolation, uid) pairs whose trial sandbox ran (:meth:`check`, once per run);
    - ``overlays``: per sandbox uid, whether a layered bind can be an overlay mount here (a trial
      run, :meth:`overlays_work`);
    - ``numbers``: the runs, numbered as started (the stall doctor's line), and ``warned``: the
      one-time warnings given (no cgroup).

    A :func:`run_python` outside a run (a test, a benchmark, :func:`check_sandbox`'s trial) uses the
    process's, :data:`OUTSIDE_RUNS`. What stays per process, and why: the launch server
    (:mod:`.launch_server`: one process forked from the trainer's, serving every run of it), the
    cgroup names (pid and a counter: unique in the process, :mod:`.cgroup`), the uid leases (lock
    files shared by every process of the machine, :func:`.isolation.lease_uid`) and whether
    bubblewrap works here (:func:`check_sandbox`: a fact of the machine, tried once per process).

    Raises:
        ValueError: ``isolation`` is not one of ``bwrap``, ``none``.
    """

    def __init__(
        self, limits: SandboxLimits | None = None, isolation: str = "bwrap", max_concurrent: int | None = None
    ):
        if isolation not in ISOLATIONS:
            raise ValueError(f"sandbox.backend: {isolation!r} is not one of {', '.join(ISOLATIONS)}")
        self.limits = limits or SandboxLimits()
        self.isolation = isolation
        self.slots = SandboxSlots(max_concurrent or default_max_sandboxes(self.limits))
        self.checked: set[tuple[str, int]] = set()
        self.overlays: dict[int, bool] = {}
        self.numbers = itertools.count()
        self.warned: set[str] = set()

    @classmethod
    def from_config(cls, sandbox: SandboxConfig | None, timeout: float | None = None) -> Sandboxes:
        """The sandboxes of a run with the ``sandbox`` section and ``timeout`` (seconds per run,
        ``agent.tool_timeout``; None: :class:`SandboxLimits`'s). ``sandbox`` None: the defaults of
        :class:`SandboxLimits`, bubblewrap, slots for half the available memory."""
        limits = SandboxLimits() if timeout is None else SandboxLimits(timeout=timeout)
        if sandbox is None:
            return cls(limits)
        limits = dataclasses.replace(
            limits,
            memory_mb=sandbox.memory_mb,
            max_open_files=sandbox.max_open_files,
            sandbox_uid=sandbox.uid,
            sandbox_uids=sandbox.num_uids,
        )
        return cls(limits, sandbox.backend, sandbox.max_concurrent)

    def check(self) -> None:
        """:func:`check_sandbox` for this run's isolation and uid, once per run (blocking: a trial
        sandbox the first time).

        Raises:
            SandboxUnavailable: the sandbox cannot run here (the message names ``sandbox.backend``).
        """
        key = (self.isolation, self.limits.sandbox_uid)
        if key not in self.checked:
            check_sandbox(*key)
            self.checked.add(key)

    async def run(
        self, code: str, timeout: float | None = None, binds: dict[str, str | list[str]] | None = None
    ) -> SandboxResult:
        """Run ``code`` in a sandbox of this run (:func:`run_python`): after :meth:`check` (the first
        time, in a thread), it waits for one of the run's ``slots``, then runs under the run's
        ``limits`` (with ``timeout`` seconds instead of theirs when given) for at most that long.

        Raises:
            SandboxUnavailable: the sandbox cannot run here.
            ValueError: a bad name of ``binds`` (see :func:`run_python`).
        """
        lim = self.limits if timeout is None else dataclasses.replace(self.limits, timeout=timeout)
        if (self.isolation, lim.sandbox_uid) not in self.checked:
            await asyncio.to_thread(self.check)
        async with self.slots:
            return await run_python(code, lim, self.isolation, checked=True, binds=binds, sandboxes=self)

    async def overlays_work(self, sandbox_uid: int) -> bool:
        """Whether the launcher can mount a read-only overlay here for runs as ``sandbox_uid`` (a user
        namespace of its own and an unprivileged overlay mount: Linux 5.11 or later, user namespaces
        allowed); checked once per run and uid with a trial run, a warning when not."""
        if sandbox_uid not in self.overlays:
            made: list[str] = []
            try:
                for i in range(2):
                    made.append(tempfile.mkdtemp(prefix="reinforge-overlay-trial-"))
                    os.chmod(made[-1], 0o755)
                    with open(os.path.join(made[-1], f"f{i}"), "w") as f:
                        f.write(str(i))
                    os.chmod(os.path.join(made[-1], f"f{i}"), 0o644)
                code = "import os\nprint(sorted(os.listdir('x')))"
                lim = SandboxLimits(timeout=30, sandbox_uid=sandbox_uid)
                token = _overlay_trial.set(True)
                try:
                    r = await run_python(code, lim, checked=True, binds={"x": list(made)}, sandboxes=self)
                finally:
                    _overlay_trial.reset(token)
            finally:
                for d in made:
                    shutil.rmtree(d, ignore_errors=True)
            ok = r.stdout.strip() == "['f0', 'f1']"
            if not ok:
                log.warning(
                    "python sandbox: no overlay can be mounted here (%s); a run on a copy-on-write workspace binds a "
                    "copy of its layers instead (made per run: slower with large bases)",
                    (r.infra_error or r.stderr or r.stdout).strip()[-300:],
                )
            self.overlays[sandbox_uid] = ok
        return self.overlays[sandbox_uid]


OUTSIDE_RUNS = Sandboxes(max_concurrent=1)
"""The sandboxes of runs made outside any run's :class:`Sandboxes` (tests, benchmarks, the trial
run of :func:`check_sandbox`); their ``slots`` are not used (:func:`run_python` takes none)."""
