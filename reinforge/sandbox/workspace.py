"""Copy-on-write workspaces: a shared, read-only base folder and one writable layer per episode.

A :class:`Workspace` is made in O(1) whatever the base's size: a new empty folder (the episode's
layer, ``reinforge-ws-<pid namespace>-<pid>-*`` in ``workspace_dir`` or the system's temporary folder) over the
base, which is never copied nor written. Reads fall through to the base where the episode's layer
has no such file; writes go to the episode's layer (a whole file at a time: the file is copied up
as it is written); :meth:`Workspace.close` deletes the layer, and with it every edit. Many episodes
(a group's samples, every rollout) share one base.

In the sandbox (:func:`reinforge.sandbox.run_python`, ``binds={name: workspace.layers}``) the
program sees the two layers merged, read-only: a read-only ``overlay`` mount that the sandbox's
launcher makes in a user namespace of its own for the run (:mod:`reinforge.sandbox.isolation`), or
where no overlay can be mounted, a copy of the merged layers made for that run.

A base is a folder (:func:`folder_base`) or a git repository at a commit (:func:`git_base`): the
commit's tree is extracted once (``git archive``, through tar's ``data`` filter: no links out, no
special files) into a cache folder shared by the episodes, processes and runs of this machine
(``<cache>/<commit>``, made under a file lock and renamed into place whole, files read-only).

Layers left by a process that was killed are removed by the next process's first workspace
(:func:`remove_stale`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

PREFIX = "reinforge-ws-"  # + pid namespace + "-" + pid + "-" + random: the episode's layer
_swept: set[str] = set()  # parent folders remove_stale ran on in this process
_COMMIT = re.compile(r"[0-9a-f]{40}([0-9a-f]{24})?")


class PathRefused(ValueError):
    """A workspace path that would leave the workspace (absolute, ``..``, a NUL, through a link),
    or a write where a folder of the path is a file."""


class Workspace:
    """One episode's copy-on-write view of ``base`` (a folder, or None: an empty workspace).

    Args:
        base: the shared read-only folder (never written), or None.
        parent: where the episode's layer is made (default: the system's temporary folder).
        name: what the messages of refused paths call the workspace (``repository``).

    Paths given to the methods are relative to the workspace, with ``/`` (``pkg/mod.py``);
    :meth:`check` says which are refused.
    """

    def __init__(self, base: str | Path | None = None, parent: str | Path | None = None, name: str = "workspace"):
        self.name = name
        if base is not None and not os.path.isdir(base):
            raise FileNotFoundError(f"the workspace base {str(base)!r} is not a folder")
        self.base = Path(os.path.realpath(base)) if base is not None else None
        parent = str(parent) if parent is not None else tempfile.gettempdir()
        if parent not in _swept:
            _swept.add(parent)
            remove_stale(parent)
        self.upper = Path(tempfile.mkdtemp(prefix=f"{_owner()}-", dir=parent))
        os.chmod(self.upper, 0o755)  # the sandbox's uid reads it (the trainer may be root)

    @property
    def layers(self) -> list[str]:
        """The host folders of the workspace, bottom first (``run_python``'s ``binds`` value)."""
        return [str(p) for p in (self.base, self.upper) if p is not None]

    def close(self) -> None:
        """Delete the episode's layer (its edits); the base stays. Idempotent."""
        shutil.rmtree(self.upper, ignore_errors=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- paths ----------------------------------------------------------------------------------

    def check(self, path: str) -> PurePosixPath:
        """``path`` as a relative path inside the workspace.

        Raises:
            PathRefused: empty, ``.``, absolute, with ``..`` or a NUL, or resolving (through a link
                of either layer) outside that layer.
        """
        rel = PurePosixPath(path.strip())
        if not path.strip() or "\0" in path or rel.is_absolute() or ".." in rel.parts or str(rel) == ".":
            raise PathRefused(f"{path!r} is not a path inside the {self.name} (give e.g. 'pkg/mod.py')")
        for layer in self._roots():
            real, root = os.path.realpath(layer / rel), os.path.realpath(layer)
            if not real.startswith(root + os.sep):
                raise PathRefused(f"{path!r} leaves the {self.name}")
        return rel

    def host_path(self, path: str) -> Path:
        """The host file a read of ``path`` sees: the episode's layer's when it has one, else the
        base's (which may not exist).

        Raises:
            PathRefused: as :meth:`check`.
        """
        rel = self.check(path)
        mine = self.upper / rel
        if self.base is None or os.path.lexists(mine):
            return mine
        return self.base / rel

    def is_file(self, path: str) -> bool:
        return self.host_path(path).is_file()

    def read_bytes(self, path: str) -> bytes:
        """The file's bytes.

        Raises:
            PathRefused: as :meth:`check`.
            FileNotFoundError: no such file.
        """
        p = self.host_path(path)
        if not p.is_file():
            raise FileNotFoundError(f"no file {path!r} in the {self.name}")
        return p.read_bytes()

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file into the episode's layer (its folders made as needed), readable by any
        uid; the base is never written.

        Raises:
            PathRefused: as :meth:`check`, or a folder of ``path`` is a file in the workspace.
        """
        rel = self.check(path)
        for parent in reversed(rel.parents[:-1]):
            seen = self.host_path(parent.as_posix())
            if os.path.lexists(seen) and not seen.is_dir():
                raise PathRefused(f"{path!r}: {parent.as_posix()} is a file, not a folder")
            d = self.upper / parent
            if not d.is_dir():
                d.mkdir()
                os.chmod(d, 0o755)
        p = self.upper / rel
        if p.is_dir():
            raise PathRefused(f"{path!r} is a folder")
        p.write_bytes(data)
        os.chmod(p, 0o644)

    def files(self) -> dict[str, int]:
        """Every file of the workspace (``{path: size in bytes}``, sorted), the episode's files
        hiding the base's; links are not followed."""
        out: dict[str, int] = {}
        for root in reversed(self._roots()):  # the episode's layer first: it wins
            for rel, size in _walk(root):
                out.setdefault(rel, size)
        return dict(sorted(out.items()))

    def own_files(self) -> int:
        """Files in the episode's layer (written by the episode or the row)."""
        return sum(1 for _ in _walk(self.upper))

    def _roots(self) -> list[Path]:
        return [p for p in (self.base, self.upper) if p is not None]


def _walk(root: Path) -> Iterator[tuple[str, int]]:
    """(relative path, size) of the regular files under ``root``, without following links."""
    for folder, _dirs, names in os.walk(root):
        for name in names:
            p = os.path.join(folder, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                yield os.path.relpath(p, root).replace(os.sep, "/"), st.st_size


def _owner() -> str:
    """``PREFIX<pid namespace>-<pid>``: a layer's owner, as no other process of any pid namespace
    names itself (a temporary folder may be shared by containers of other pid namespaces)."""
    try:
        ns = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        ns = 0
    return f"{PREFIX}{ns}-{os.getpid()}"


def remove_stale(parent: str | Path) -> list[Path]:
    """Delete the episode layers in ``parent`` whose process no longer runs (it was killed before
    it could close them): those of this pid namespace whose pid is gone. Returns the folders removed."""
    removed: list[Path] = []
    ours = _owner().rsplit("-", 1)[0] + "-"  # PREFIX<pid namespace>-
    try:
        entries = list(Path(parent).glob(ours + "*"))
    except OSError:
        return removed
    for d in entries:
        pid = d.name[len(ours) :].split("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


# -- bases --------------------------------------------------------------------------------------


def folder_base(path: str | Path) -> Path:
    """A folder used as it is as a base (never written; it must stay unchanged while episodes use
    it, and be readable by the sandbox's uid).

    Raises:
        FileNotFoundError: not a folder.
        ValueError: ``/``, a folder of ``/proc``, ``/sys`` or ``/dev``, or one that holds the models
            cache (the sandbox would expose them).
    """
    from ..models.hub import cache_dir

    p = Path(os.path.realpath(os.path.expanduser(str(path))))
    if not p.is_dir():
        raise FileNotFoundError(f"the workspace base {str(path)!r} is not a folder")
    models = Path(os.path.realpath(cache_dir()))
    if p == Path("/") or p.parts[1:2] in (("proc",), ("sys",), ("dev",)) or models == p or p in models.parents:
        raise ValueError(f"the workspace base {str(path)!r} would expose {p} to the sandbox: use a folder of its own")
    return p


def git_base(repo: str, commit: str, cache: str | Path) -> Path:
    """The tree of ``commit`` in the git repository ``repo`` (a local path or a URL git can fetch),
    extracted once into ``cache/<commit>`` and reused (module docstring).

    Raises:
        ValueError: ``commit`` is not a full hexadecimal commit id (40 or 64 digits).
        RuntimeError: git failed (no such repository or commit; the message has git's).
    """
    commit = commit.strip().lower()
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"the base commit {commit!r} is not a full commit id (40 hexadecimal digits)")
    cache = Path(cache)
    dest = cache / commit
    if dest.is_dir():
        return dest
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{commit}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one extraction per commit, whoever asks at once
        if dest.is_dir():
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{commit}-", dir=cache))
        try:
            _extract(repo, commit, tmp)
            for folder, _dirs, names in os.walk(tmp):
                os.chmod(folder, 0o755)
                for name in names:
                    p = os.path.join(folder, name)
                    if not os.path.islink(p):
                        os.chmod(p, 0o555 if os.stat(p).st_mode & 0o100 else 0o444)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"}


def _git(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], env=_git_env(), capture_output=True, text=True)


def _extract(repo: str, commit: str, dest: Path) -> None:
    """``git archive`` of ``commit`` unpacked into ``dest`` (a local repository is read in place;
    anything else is fetched at that commit, depth 1, into a scratch repository first)."""
    if shutil.which("git") is None:
        raise RuntimeError("a git base needs git (`apt-get install git`)")
    if not hasattr(tarfile, "data_filter"):
        raise RuntimeError("a git base needs tarfile's extraction filters (Python 3.10.12, 3.11.4 or later)")
    if repo.startswith("-"):  # git would read it as an option (--upload-pack=... runs a command)
        raise ValueError(f"the base repository {repo!r} starts with '-': name a path or a URL")
    scratch = None
    source = os.path.expanduser(repo)
    try:
        if not os.path.isdir(source):
            scratch = tempfile.mkdtemp(prefix=".fetch-", dir=dest.parent)
            for args in (
                ["init", "-q", "--bare", scratch],
                ["-C", scratch, "fetch", "-q", "--depth", "1", "--end-of-options", repo, commit],
            ):
                r = _git(args)
                if r.returncode:
                    raise RuntimeError(f"git {' '.join(args[:3])} ... {repo} failed: {r.stderr.strip()[-500:]}")
            source = scratch
        cmd = ["git", "-C", source, "archive", "--format=tar", f"{commit}^{{tree}}"]
        with subprocess.Popen(cmd, env=_git_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            try:
                with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:  # streamed: never all in memory
                    tar.extractall(dest, filter="data")
            except tarfile.ReadError:
                pass  # git failed before writing a tar: its message follows
            err = proc.stderr.read().decode(errors="replace").strip()[-500:]
        if proc.returncode:
            raise RuntimeError(f"git archive of {commit} in {repo} failed: {err}")
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
