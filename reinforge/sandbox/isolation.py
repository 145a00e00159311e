"""How a sandbox is built on the host: the launcher, the bubblewrap arguments, the seccomp filter.

Threat model (docs/agents.md#threat-model): the program is hostile. Nothing inside may be root
anywhere, share kernel state with the trainer, or outlive it. A run is started as

    python -I -S -c LAUNCHER SPEC... bwrap ARGS -- python -I -c PRELUDE ...

or, by default, by the trainer's launch server (:mod:`.launch_server`), which forks a process that
runs the same launcher code on the same arguments: the interpreter started once, not per run.

The **launcher** (:data:`LAUNCHER`, a few lines of Python run before ``bwrap``; it reads no
input of the model's) does, in this order:

1. joins the run's cgroup (memory, processes, CPU of the whole sandbox: :mod:`.cgroup`);
2. when the trainer is root and a folder to bind is not reachable by the sandbox's uid (an
   interpreter under ``/root``): makes a private mount namespace of its own and binds those folders
   at ``STAGE/<i>``, a path any uid can traverse (nothing of it is visible on the host);
3. when the trainer is root: drops to ``sandbox.uid`` (uid and gid, no supplementary
   groups), so that the user namespace ``bwrap`` makes maps the sandbox to that unprivileged host
   uid, not to root (which would let the program write host-wide ``/proc/sys`` settings);
4. when a folder is shown as layers (a copy-on-write workspace: a shared base and the episode's
   own layer, :func:`overlay_option`): makes a user namespace of its own (its uid mapped to itself,
   nothing else) with a private mount namespace, and mounts there a read-only ``overlay`` of the
   layers on top of the top layer's path, which ``bwrap`` then binds like any folder (the mount
   exists only in that namespace and vanishes with the run; bubblewrap 0.8 has no overlay options);
5. joins a fresh, empty session keyring (nothing of the trainer's keys is reachable);
6. sets its parent-death signal (SIGKILL: the death of its parent, the trainer or its launch
   server, kills it) and checks that the parent is still there; then ``exec``\\ s ``bwrap``.

``bwrap`` then unshares every namespace (user, mount, pid, network, IPC, UTS, cgroup), forbids
nested user namespaces, installs the seccomp filter (:data:`DENIED_SYSCALLS` fail with ``EPERM``,
sockets of a family not in :data:`SOCKET_FAMILIES` with ``EAFNOSUPPORT``; other architectures'
system calls kill the process), and starts the interpreter as uid 65534 inside with no
capabilities, as **pid 1** (``--as-pid-1``: no reaper of bubblewrap's, whose memory the program
could write, issue 51 E1) with ``--die-with-parent`` (when ``bwrap`` dies, so does pid 1, and the
kernel kills every process of the pid namespace). The interpreter's prelude (``prelude.PRELUDE``)
makes pid 1 non-dumpable (no ``/proc/1/mem``, ``ptrace`` or ``pidfd_getfd`` for the program), forks
the program as its child and reaps until it exits. At the time limit the host kills pid 1 from
outside (its host pid from bwrap's status: :func:`.io.kill_init`).

When the trainer is root, each sandbox running at once drops to a host uid of its own
(:func:`lease_uid`), so per-uid kernel quotas are not shared between sandboxes.

Files: an empty root, read-only; ``/usr`` and the loader's files; the interpreter's prefixes
read-only; ``/proc`` of the new pid namespace with ``/proc/cmdline`` empty; ``/dev`` read-only with
a ``/dev/shm`` of its own; the scratch ``tmpfs`` (working directory, ``HOME``, ``/tmp``). The sizes
of all tmpfs mounts together are ``disk_mb`` (:func:`tmpfs_sizes`).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import itertools
import logging
import os
import shutil
import stat
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

SCRATCH = "/scratch"  # the working directory inside the sandbox
STAGE = "/run/reinforge-sandbox"  # where the launcher binds what the sandbox's uid cannot reach (its own mounts)
INSIDE_UID = 65534  # the program's uid and gid inside the sandbox ("nobody")
LAUNCHER_EXIT = 125  # the launcher's exit status when a step failed (its stderr says which)

DENIED_SYSCALLS = (
    # kernel keyrings (the trainer's secrets), tracing and kernel-programming interfaces
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # namespaces and mounts
    "mount",
    "umount2",
    "pivot_root",
    "unshare",
    "setns",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "open_by_handle_at",
    "name_to_handle_at",
    # the machine
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "lookup_dcookie",
    "vhangup",
    "iopl",
    "ioperm",
    # another process's memory or descriptors (issue 51, E1): pid 1 of the sandbox is also made non-dumpable
    "pidfd_getfd",
    "process_madvise",
    "kcmp",
)
"""System calls the sandboxed program may not make (``EPERM``): Docker's default profile's list
narrowed to what a Python program never needs, the issue 34 set (keyrings, ptrace, bpf,
perf, userfaultfd, io_uring, mount, unshare, setns), and the calls that reach into another process
(``pidfd_getfd``, ``process_madvise``, ``kcmp``: issue 51)."""

SOCKET_FAMILIES = (1, 2, 10, 16)
"""The socket address families the program may create (``socket``, ``socketpair``): ``AF_UNIX``,
``AF_INET``, ``AF_INET6``, ``AF_NETLINK``, the ones its network namespace isolates and Python uses.
Every other family (0-63) fails with ``EAFNOSUPPORT``, as a kernel without it would answer:
``AF_VSOCK`` above all (issue 51, E2: the network namespace does not cover it, its ports are the
host's, and a connect reaches the hypervisor; Docker's default profile refuses it too), and the
families no namespace is needed for (``AF_PACKET``, ``AF_ALG``, ``AF_BLUETOOTH``...). The family is
compared on its low 32 bits (the kernel reads an ``int``); a value with any higher bit set fails."""

LAUNCHER = r"""
import ctypes, os, sys
# argv: uid ("-": keep), parent pid, keyctl's number, stage ("-": none), N, N cgroup.procs files, M, M sources,
# K, K (mount point, overlay options) pairs, then the command (no json: its import alone costs 14 ms of each start)
a = sys.argv[1:]
n = int(a[4])
m = int(a[5 + n])
k = int(a[6 + n + m])
spec = {"uid": None if a[0] == "-" else int(a[0]), "parent": int(a[1]), "keyctl": int(a[2]),
        "stage": None if a[3] == "-" else a[3], "cgroup_procs": a[5:5 + n], "stage_sources": a[6 + n:6 + n + m],
        "overlays": [a[7 + n + m + 2 * i:9 + n + m + 2 * i] for i in range(k)], "command": a[7 + n + m + 2 * k:]}
libc = ctypes.CDLL(None, use_errno=True)

def fail(step, err):
    os.write(2, ("reinforge sandbox launcher: %s: %s\n" % (step, err)).encode())
    os._exit(125)

def call(rc, step):
    if rc != 0:
        fail(step, os.strerror(ctypes.get_errno()))

try:
    for f in spec["cgroup_procs"]:
        with open(f, "w") as out:
            out.write(str(os.getpid()))
except OSError as e:
    fail("joining the cgroup", e)
if spec["stage"]:
    stage = spec["stage"]
    call(libc.unshare(0x00020000), "unshare(CLONE_NEWNS)")
    call(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "making the mount namespace private")
    try:
        fds = [os.open(p, os.O_PATH) for p in spec["stage_sources"]]
    except OSError as e:
        fail("opening a folder to bind", e)
    call(libc.mount(b"tmpfs", stage.encode(), b"tmpfs", 0x2 | 0x4 | 0x8, b"mode=0755,size=64k"), "tmpfs on " + stage)
    for i, fd in enumerate(fds):
        point = "%s/%d" % (stage, i)
        if os.path.isdir("/proc/self/fd/%d" % fd):
            os.mkdir(point, 0o755)
        else:
            open(point, "w").close()
        call(libc.mount(("/proc/self/fd/%d" % fd).encode(), point.encode(), None, 0x1000 | 0x4000, None),
             "binding " + spec["stage_sources"][i])
        os.close(fd)
uid = spec["uid"]
if uid is not None:
    try:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    except OSError as e:
        fail("dropping to uid %d" % uid, e)
if spec["overlays"]:
    u, g = os.getuid(), os.getgid()
    call(libc.prctl(4, 1, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")  # the uid drop made /proc/self/*_map root's
    call(libc.unshare(0x10000000 | 0x00020000), "unshare(CLONE_NEWUSER | CLONE_NEWNS)")
    try:
        for name, text in (("uid_map", "%d %d 1" % (u, u)), ("setgroups", "deny"), ("gid_map", "%d %d 1" % (g, g))):
            with open("/proc/self/" + name, "w") as out:
                out.write(text)
    except OSError as e:
        fail("mapping the uid in a user namespace for the overlay", e)
    call(libc.mount(b"none", b"/", None, 0x4000 | 0x40000, None), "making the mount namespace private")
    for point, options in spec["overlays"]:
        call(libc.mount(b"overlay", point.encode(), b"overlay", 0x1, options.encode()), "mounting the overlay " + point)
if libc.syscall(spec["keyctl"], 1, None) < 0:  # KEYCTL_JOIN_SESSION_KEYRING, anonymous: a fresh, empty one
    fail("joining a new session keyring", os.strerror(ctypes.get_errno()))
call(libc.prctl(1, 9, 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
if os.getppid() != spec["parent"]:
    fail("checking the parent", "it has exited")
try:
    os.execv(spec["command"][0], spec["command"])
except OSError as e:
    fail("starting " + spec["command"][0], e)
"""


class SandboxUnavailable(RuntimeError):
    """The operating-system sandbox cannot run here; the message says why and what to do."""


BWRAP_ENV = "REINFORGE_BWRAP"  # an explicit bubblewrap executable, instead of `bwrap` on PATH


def bwrap_path() -> str | None:
    """The ``bwrap`` executable: ``$REINFORGE_BWRAP`` when set (a path, or a name looked up on
    ``PATH``; None when it names nothing executable), else ``bwrap`` on ``PATH``; None when there is
    none (so taking bubblewrap off ``PATH`` disables the sandbox, and the python tool refuses to start)."""
    override = os.environ.get(BWRAP_ENV)
    if override:
        return shutil.which(override)
    return shutil.which("bwrap")


def host_uid(sandbox_uid: int) -> int | None:
    """The host uid the sandbox runs as: ``sandbox_uid`` when the trainer is root (it drops to it;
    the first of the range :func:`lease_uid` leases each run's own uid from), else None (the
    trainer's own, unprivileged, uid)."""
    return sandbox_uid if os.geteuid() == 0 else None


UID_LOCKS = "reinforge-sandbox-uids"  # the folder of the uid leases' lock files, under /run/lock (or /run)
_uid_turn = itertools.count()
_warned_uids: list[bool] = []


@functools.lru_cache(maxsize=1)
def uid_lock_dir() -> str | None:
    """The folder of the uid leases' lock files (``/run/lock/reinforge-sandbox-uids``, else under
    ``/run``), made by root, mode 0700; None where none can be made or it is not root's alone (then
    every sandbox shares ``sandbox.uid``, with a warning)."""
    for parent in ("/run/lock", "/run"):
        if not os.path.isdir(parent):
            continue
        folder = os.path.join(parent, UID_LOCKS)
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            st = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and not st.st_mode & 0o022:
            return folder
    return None


def lease_uid(base: int, count: int) -> tuple[int, int | None]:
    """A host uid of its own for one sandbox while it runs: the first of ``base .. base + count - 1``
    (tried from a turn that moves on at each call) that no other running sandbox of any trainer on
    this machine holds, held by an exclusive ``flock`` on ``<uid_lock_dir()>/<uid>`` (released by
    closing the returned descriptor, or when the trainer dies).

    Per-uid kernel quotas (inotify instances, the key quota of the session keyrings, POSIX message
    queues, queued signals, processes) are then one sandbox's own: one sandbox cannot starve the
    others (issue 51, E5). Called only when the trainer is root (it drops to the uid).

    Returns:
        ``(uid, descriptor)``; ``(base, None)`` when ``count`` is 1, no lock folder can be made, or
        every uid of the range is held (then the sandbox shares ``base``; a warning, once).
    """
    folder = uid_lock_dir() if count > 1 else None
    if folder is not None:
        start = next(_uid_turn)
        for i in range(count):
            uid = base + (start + i) % count
            fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return uid, fd
            except BlockingIOError:
                os.close(fd)
    if count > 1 and not _warned_uids:
        _warned_uids.append(True)
        log.warning(
            "python sandbox: no host uid of its own for a sandbox (%s): sandboxes share uid %d and its kernel "
            "quotas; raise sandbox.num_uids or lower sandbox.max_concurrent",
            f"all {count} of {base}..{base + count - 1} are in use" if folder else "no lock folder under /run",
            base,
        )
    return base, None


@functools.lru_cache(maxsize=1)
def seccomp_program() -> bytes:
    """The compiled seccomp filter (classic BPF for ``bwrap --seccomp``): :data:`DENIED_SYSCALLS`
    return ``EPERM``, a socket of a family not in :data:`SOCKET_FAMILIES` ``EAFNOSUPPORT``, everything
    else is allowed, system calls of another architecture kill the
    process (libseccomp's default for a foreign architecture). Names this kernel's libseccomp
    does not know are left out.

    Raises:
        SandboxUnavailable: libseccomp (``libseccomp.so.2``) or its binding is missing.
    """
    try:
        import pyseccomp
    except (ImportError, OSError, RuntimeError) as e:
        raise SandboxUnavailable(
            f"the python tool's seccomp filter needs libseccomp ({e}); install libseccomp2 "
            f"(`apt-get install libseccomp2`) and the pyseccomp package"
        ) from None
    f = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in DENIED_SYSCALLS:
        try:
            f.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
        except (RuntimeError, ValueError, OSError):
            pass  # not a system call of this architecture / libseccomp version
    refuse = pyseccomp.ERRNO(errno.EAFNOSUPPORT)
    for name in ("socket", "socketpair"):  # the family is argument 0 of both
        for family in range(64):
            if family not in SOCKET_FAMILIES:
                f.add_rule(refuse, name, pyseccomp.Arg(0, pyseccomp.MASKED_EQ, 0xFFFFFFFF, family))
        f.add_rule(refuse, name, pyseccomp.Arg(0, pyseccomp.GE, 64))  # families to come, and high bits set
    with tempfile.TemporaryFile() as t:
        f.export_bpf(t)
        t.flush()
        t.seek(0)
        return t.read()


@functools.lru_cache(maxsize=1)
def keyctl_number() -> int:
    """The ``keyctl`` system call's number on this machine (the launcher calls it)."""
    import pyseccomp

    return int(pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, "keyctl"))


@functools.lru_cache(maxsize=1)
def read_only_paths() -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """(symlinks as (target, path), folders and files to bind read-only): the system folders, the
    loader's files and the interpreter's prefixes, without any folder inside another.

    Raises:
        SandboxUnavailable: a prefix would expose the models cache (``~/.cache/reinforge``).
    """
    links, binds = [], []
    for p in ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(p):
            links.append((os.readlink(p), p))
        elif os.path.isdir(p):
            binds.append(p)
    binds += [
        p
        for p in ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime")
        if os.path.exists(p)
    ]
    prefixes = {
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        str(Path(os.path.realpath(sys.executable)).parent.parent),
    }
    from ..models.hub import cache_dir

    models = os.path.realpath(cache_dir())
    for p in sorted(os.path.realpath(p) for p in prefixes):
        if any(p == b or p.startswith(b.rstrip("/") + "/") for b in binds):
            continue
        if p == "/" or models == p or models.startswith(p + "/"):
            raise SandboxUnavailable(
                f"the python interpreter's prefix {p} holds the models cache {models}; the "
                f"sandbox would expose it: use a virtualenv elsewhere or set REINFORGE_CACHE"
            )
        binds.append(p)
    return tuple(links), tuple(binds)


def reachable_by_others(path: str) -> bool:
    """Whether any uid can reach ``path``: every folder above it searchable by others (``o+x``)."""
    parent = os.path.dirname(os.path.abspath(path))
    while True:
        try:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
        if parent == "/":
            return True
        parent = os.path.dirname(parent)


def tmpfs_sizes(disk_mb: int, tmp_mount: bool) -> dict[str, int]:
    """Bytes of each writable tmpfs, together ``disk_mb`` MiB: ``/dev/shm`` an eighth (at least
    1 MiB), ``/tmp`` another eighth when it must be a mount of its own (an interpreter under
    ``/tmp``; otherwise ``/tmp`` is the scratch folder), the scratch folder the rest."""
    total = disk_mb * 2**20
    part = max(2**20, total // 8)
    sizes = {"/dev/shm": part, "/tmp": part if tmp_mount else 0}
    sizes[SCRATCH] = max(2**20, total - sum(sizes.values()))
    return sizes


def bwrap_args(
    disk_mb: int, stage_of: dict[str, str], fds: dict[str, int], workdir_binds: dict[str, str] | None = None
) -> list[str]:
    """The bubblewrap arguments of one run (module docstring).

    Args:
        disk_mb: the MiB of all writable tmpfs mounts together.
        stage_of: folders the launcher binds at ``STAGE/<i>`` first (bound from there).
        fds: file descriptors bwrap reads: ``program`` (main.py), ``seccomp`` (the filter),
            ``empty`` (an empty file, shown as ``/proc/cmdline``), ``status`` (bwrap's JSON status).
        workdir_binds: host folders shown read-only inside the working directory, ``{name: host path}``
            (``SCRATCH/<name>``; an episode's workspace).
    """
    links, binds = read_only_paths()
    args = [
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--die-with-parent",
        "--as-pid-1",
        "--new-session",
        "--uid",
        str(INSIDE_UID),
        "--gid",
        str(INSIDE_UID),
        "--cap-drop",
        "ALL",
        "--json-status-fd",
        str(fds["status"]),
        "--seccomp",
        str(fds["seccomp"]),
    ]
    # an interpreter under /tmp (a virtualenv in a checkout there): /tmp becomes a tmpfs of its own before the
    # interpreter is bound inside it (the symlink to the scratch folder cannot be made there)
    tmp_mount = any(p == "/tmp" or p.startswith("/tmp/") for p in binds)
    sizes = tmpfs_sizes(disk_mb, tmp_mount)
    if tmp_mount:
        args += ["--perms", "1777", "--size", str(sizes["/tmp"]), "--tmpfs", "/tmp"]
    for p in binds:
        args += ["--ro-bind", stage_of.get(p, p), p]
    for target, p in links:
        args += ["--symlink", target, p]
    args += [
        "--proc",
        "/proc",
        "--ro-bind-data",
        str(fds["empty"]),
        "/proc/cmdline",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--size",
        str(sizes["/dev/shm"]),
        "--tmpfs",
        "/dev/shm",
        "--remount-ro",
        "/dev",
        "--perms",
        "0700",
        "--size",
        str(sizes[SCRATCH]),
        "--tmpfs",
        SCRATCH,
    ]
    if not tmp_mount:
        args += ["--symlink", SCRATCH, "/tmp"]
    args += ["--chdir", SCRATCH, "--remount-ro", "/", "--clearenv"]
    for k, v in sandbox_env(SCRATCH).items():
        args += ["--setenv", k, v]
    args += ["--file", str(fds["program"]), f"{SCRATCH}/main.py"]
    for name, host in (workdir_binds or {}).items():
        args += ["--ro-bind", stage_of.get(host, host), f"{SCRATCH}/{name}"]
    return args


def staged_paths(uid: int | None, extra: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """The read-only folders the launcher binds at ``STAGE/<i>`` first: those the host ``uid`` the
    sandbox runs as cannot reach (none when it runs as the trainer's own uid, ``uid=None``), of the
    system folders and of ``extra`` (folders bound into the working directory)."""
    if uid is None:
        return {}
    _, binds = read_only_paths()
    return {p: f"{STAGE}/{i}" for i, p in enumerate(p for p in (*binds, *extra) if not reachable_by_others(p))}


def overlay_option(layers: list[str] | tuple[str, ...], stage_of: dict[str, str]) -> str:
    """The ``overlay`` mount options that show ``layers`` (host folders, bottom first) as one
    read-only folder: ``lowerdir=top:...:bottom`` (staged paths where :func:`staged_paths` has them).

    Raises:
        ValueError: a layer's path holds a character the option cannot carry (``:``, ``,``, ``\\``,
            a newline).
    """
    for p in layers:
        if any(c in p for c in ":,\\\n"):
            raise ValueError(f"the workspace layer {p!r} has ':', ',', '\\' or a newline in its path: move it")
    return "lowerdir=" + ":".join(stage_of.get(p, p) for p in reversed(layers))


def launcher_args(
    cgroup_procs: list[str],
    uid: int | None,
    stage_of: dict[str, str],
    parent: int,
    overlays: list[tuple[str, str]] | None = None,
) -> list[str]:
    """The launcher's arguments before the command (:data:`LAUNCHER`'s ``argv[1:]``).

    Args:
        cgroup_procs: the ``cgroup.procs`` files to join (none without a cgroup).
        uid: the host uid to drop to (:func:`host_uid`), or None to keep the trainer's.
        stage_of: :func:`staged_paths` of that uid.
        parent: the pid of the launcher's parent (the trainer, or its launch server): the launcher
            refuses to go on when it has exited.
        overlays: ``(mount point, options)`` of each read-only overlay (:func:`overlay_option`).
    """
    if stage_of:
        os.makedirs(STAGE, mode=0o755, exist_ok=True)
    return [
        "-" if uid is None else str(uid),
        str(parent),
        str(keyctl_number()),
        STAGE if stage_of else "-",
        str(len(cgroup_procs)),
        *cgroup_procs,
        str(len(stage_of)),
        *stage_of,
        str(len(overlays or ())),
        *(x for pair in overlays or () for x in pair),
    ]


def launcher_command(
    command: list[str],
    cgroup_procs: list[str],
    uid: int | None,
    stage_of: dict[str, str],
    overlays: list[tuple[str, str]] | None = None,
) -> list[str]:
    """``python -I -S -c LAUNCHER ARGS... COMMAND...``: it prepares the process (module docstring)
    and ``exec``\\ s ``command`` (bwrap and its arguments); ``ARGS`` are :func:`launcher_args`
    with this process as the parent."""
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        LAUNCHER,
        *launcher_args(cgroup_procs, uid, stage_of, os.getpid(), overlays),
        *command,
    ]


def sandbox_env(home: str) -> dict[str, str]:
    """The program's whole environment (nothing of the trainer's)."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def host_env() -> dict[str, str]:
    """The launcher's and bwrap's environment."""
    return {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8"}
