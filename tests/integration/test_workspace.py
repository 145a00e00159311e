"""Copy-on-write workspaces (issue 35 item 2): a shared base (a folder, or a git repository at a
commit extracted once into a cache) under one writable layer per episode; nothing of the base is
copied; edits are the episode's own; the sandbox sees the merged view read-only; nothing is left on
disk after close. The cost of making one is measured by bench/sandbox_fleet.py, not here."""

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from reinforge.envs import EnvContext, Turn, load_environment
from reinforge.sandbox import Sandboxes, SandboxLimits, SandboxResult, bwrap_path, run_python
from reinforge.sandbox import runner as sb
from reinforge.sandbox.workspace import PREFIX, PathRefused, Workspace, git_base, remove_stale
from reinforge.tools import ToolCall, ToolSet

needs_bwrap = pytest.mark.skipif(bwrap_path() is None, reason="bubblewrap (bwrap) is not installed")

MODULE = "def add(a, b):\n    return a - b\n"
TESTS = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t"}
    env["GIT_COMMITTER_EMAIL"] = "t@t"
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A git repository of a small package: the first commit has the bug, the second fixes it."""
    root = tmp_path_factory.mktemp("repo")
    _git(root, "init", "-q")
    (root / "calc.py").write_text(MODULE)
    (root / "test_calc.py").write_text(TESTS)
    (root / "pkg").mkdir()
    (root / "pkg" / "data.txt").write_text("base data\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "buggy")
    buggy = _git(root, "rev-parse", "HEAD").strip()
    (root / "calc.py").write_text(MODULE.replace("-", "+"))
    _git(root, "commit", "-q", "-am", "fixed")
    return root, buggy, _git(root, "rev-parse", "HEAD").strip()


def _readable(path: Path) -> Path:
    """``path`` and its parents made traversable by the sandbox's uid (pytest's tmp folders are 0700)."""
    for p in [path, *path.parents]:
        if str(p) in ("/", "/tmp"):
            break
        os.chmod(p, os.stat(p).st_mode | 0o055)
    return path


def _big_base(root: Path, n: int) -> Path:
    for i in range(n):
        d = root / f"d{i % 20}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"f{i}.py").write_text(f"X = {i}\n")
    return root


# ---------------------------------------------------------------- the host side
def test_a_workspace_copies_nothing_and_edits_stay_its_own(tmp_path):
    base = _big_base(tmp_path / "base", 2000)
    before = {p: p.stat().st_mtime_ns for p in base.rglob("*")}
    spaces = [Workspace(base, tmp_path) for _ in range(20)]
    for ws in spaces:
        assert list(ws.upper.iterdir()) == [] and ws.layers == [str(base), str(ws.upper)]  # O(1): nothing copied
    a, b = spaces[:2]
    a.write_bytes("d3/f3.py", b"X = 'a'\n")
    b.write_bytes("d3/f3.py", b"X = 'b'\n")
    a.write_bytes("new/deep/file.py", b"NEW = 1\n")
    assert a.read_bytes("d3/f3.py") == b"X = 'a'\n" and b.read_bytes("d3/f3.py") == b"X = 'b'\n"
    assert spaces[2].read_bytes("d3/f3.py") == b"X = 3\n" and (base / "d3" / "f3.py").read_text() == "X = 3\n"
    assert not spaces[2].is_file("new/deep/file.py")
    files = a.files()
    assert len(files) == 2001 and files["d3/f3.py"] == len(b"X = 'a'\n") and a.own_files() == 2
    assert {p: p.stat().st_mtime_ns for p in base.rglob("*")} == before  # the base was never written
    for ws in spaces:
        ws.close()
        ws.close()  # idempotent
    assert not any(p.name.startswith(PREFIX) for p in tmp_path.iterdir())


def test_paths_that_leave_either_layer_are_refused(tmp_path):
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    (base / "pkg" / "m.py").write_text("M = 1\n")
    (base / "notes").write_text("a file\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    os.symlink(secret, base / "leak")
    os.symlink("/etc", base / "etc")
    os.symlink("pkg/m.py", base / "inside")  # a link that stays inside: fine
    with Workspace(base, tmp_path) as ws:
        for bad in ("/etc/passwd", "../secret.txt", "pkg/../../secret.txt", "leak", "etc/passwd", ".", "", "a\0b"):
            with pytest.raises(PathRefused):
                ws.read_bytes(bad)
            with pytest.raises(PathRefused):
                ws.write_bytes(bad, b"x")
        with pytest.raises(PathRefused, match="is a file"):
            ws.write_bytes("notes/x.py", b"x")
        assert ws.read_bytes("inside") == b"M = 1\n"
        ws.write_bytes("leak2", b"mine")  # a new name: written into the episode's layer
        assert secret.read_text() == "secret" and not (base / "leak2").exists()
    with pytest.raises(FileNotFoundError, match="not a folder"):
        Workspace(tmp_path / "nope")


def test_a_git_base_is_extracted_once_read_only_and_shared(repo, tmp_path):
    root, buggy, fixed = repo
    cache = tmp_path / "cache"
    a = git_base(str(root), buggy, cache)
    assert git_base(str(root), buggy.upper(), cache) == a == cache / buggy  # cached: the same folder
    assert (a / "calc.py").read_text() == MODULE and (a / "pkg" / "data.txt").read_text() == "base data\n"
    assert not (a / ".git").exists() and not os.stat(a / "calc.py").st_mode & 0o222  # read-only files
    b = git_base(f"file://{root}", fixed, cache)  # through git fetch, as for a URL
    assert "a + b" in (b / "calc.py").read_text()
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == sorted([buggy, fixed])
    assert not [p for p in cache.iterdir() if p.is_dir() and p.name.startswith(".")]  # no half-made folder
    with pytest.raises(ValueError, match="full commit id"):
        git_base(str(root), "HEAD", cache)
    with pytest.raises(RuntimeError, match="git"):
        git_base(str(root), "1" * 40, cache)
    with pytest.raises(RuntimeError, match="git"):
        git_base(str(tmp_path / "no-repo"), "1" * 40, cache)
    assert not (cache / ("1" * 40)).exists()
    marker = tmp_path / "injected"
    with pytest.raises(ValueError, match="starts with '-'"):  # an option, not a repository: git would run it
        git_base(f"--upload-pack=touch {marker};", "2" * 40, cache)
    assert not marker.exists()


def test_a_folder_base_that_would_expose_the_host_is_refused(tmp_path, monkeypatch):
    from reinforge.sandbox.workspace import folder_base

    monkeypatch.setenv("REINFORGE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "cache").mkdir()
    for bad in ("/", "/proc/self", str(tmp_path), str(tmp_path / "cache")):
        with pytest.raises(ValueError, match="would expose"):
            folder_base(bad)
    (tmp_path / "repo").mkdir()
    assert folder_base(tmp_path / "repo") == tmp_path / "repo"


def test_layers_of_a_killed_process_are_swept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ns = os.stat("/proc/self/ns/pid").st_ino
    stale = tmp_path / f"{PREFIX}{ns}-{dead.stdout.strip()}-abc"
    elsewhere = tmp_path / f"{PREFIX}{ns + 1}-{dead.stdout.strip()}-abc"  # another pid namespace's: not ours to judge
    for d in (stale, elsewhere):
        (d / "sub").mkdir(parents=True)
    mine = Workspace(None, tmp_path)
    assert not stale.exists() and elsewhere.exists() and mine.upper.exists()  # the first workspace sweeps
    assert remove_stale(tmp_path) == []  # ours is alive
    mine.close()


# ---------------------------------------------------------------- in the sandbox
LOOK = (
    "import os\nprint(open('repo/calc.py').read().splitlines()[-1].strip())\nprint(sorted(os.listdir('repo')))\n"
    "print(open('repo/pkg/data.txt').read().strip())\n"
    "try:\n    open('repo/x', 'w')\nexcept OSError as e:\n    print(type(e).__name__, e.errno)\n"
)


@needs_bwrap
@pytest.mark.parametrize("overlay", [True, False])
def test_the_sandbox_sees_the_episodes_edits_read_only(repo, tmp_path, monkeypatch, overlay):
    """The merged view, read-only: an overlay mount made by the launcher (the trainer is root here:
    the sandbox's uid mounts it in a user namespace of its own), or where none can be made, a copy
    of the layers for the run, deleted after it."""
    root, buggy, _ = repo
    base = git_base(str(root), buggy, _readable(tmp_path) / "cache")
    if not overlay:
        monkeypatch.setitem(sb.OUTSIDE_RUNS.overlays, SandboxLimits().sandbox_uid, False)
    monkeypatch.setattr(sb.tempfile, "tempdir", str(tmp_path))  # where a copy would be made
    with Workspace(base, tmp_path) as ws, Workspace(base, tmp_path) as other:
        ws.write_bytes("calc.py", MODULE.replace("-", "+").encode())
        ws.write_bytes("pkg/new.py", b"")
        r = asyncio.run(run_python(LOOK, SandboxLimits(), binds={"repo": ws.layers}))
        assert r.returncode == 0 and r.infra_error is None, r
        last, listing, data, write = r.stdout.strip().splitlines()
        assert last == "return a + b" and data == "base data" and write == "OSError 30", r.stdout  # EROFS
        assert eval(listing) == ["calc.py", "pkg", "test_calc.py"]
        r2 = asyncio.run(run_python(LOOK, SandboxLimits(), binds={"repo": other.layers}))
        assert r2.stdout.splitlines()[0] == "return a - b"  # the other episode: the base as it is
        assert not (ws.upper / "x").exists() and not (Path(base) / "x").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("reinforge-", PREFIX))], list(tmp_path.iterdir())


def test_layers_without_isolation_are_a_copy(tmp_path):
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    for d, text in ((lower, "low"), (upper, "up")):
        d.mkdir()
        (d / "f.txt").write_text(text)
    (lower / "only.txt").write_text("only")
    code = "import os\nprint(open('w/f.txt').read(), open('w/only.txt').read(), os.path.islink('w'))"
    r = asyncio.run(run_python(code, SandboxLimits(), "none", binds={"w": [str(lower), str(upper)]}))
    assert r.stdout.split() == ["up", "only", "False"], r
    with pytest.raises(ValueError, match="binds"):
        asyncio.run(run_python("pass", SandboxLimits(), "none", binds={"w": []}))


# ---------------------------------------------------------------- the swe environment
def _env(row, *overrides, **kwargs):
    from reinforge.config import load_config

    no_bwrap = ["sandbox.backend=none"] if bwrap_path() is None else []
    cfg = load_config(None, ["agent.environment=swe", *no_bwrap, *overrides])
    sandboxes = Sandboxes.from_config(cfg.sandbox, cfg.agent.tool_timeout)
    return load_environment("swe")(row, EnvContext(cfg.agent, ToolSet([]), kwargs, sandboxes))


async def _calls(env, *calls):
    step = await env.step(Turn("", [ToolCall(name, args) for name, args in calls]))
    return [r.output for r in step.tool_results]


def test_swe_rows_on_a_git_base(repo, tmp_path):
    """Rows name a base instead of embedding files: episodes over one commit share its extraction;
    the tests run on the edited workspace; an embedded file lies over the base."""
    root, buggy, _ = repo
    row = {
        "prompt": "fix add",
        "label": "",
        "metadata": {"swe": {"base": {"repo": str(root), "commit": buggy}, "tests": ["test_calc"], "n_tests": 1}},
    }
    cache = _readable(tmp_path) / "cache"
    kw = {"base_cache": str(cache), "workspace_dir": str(tmp_path)}

    async def episode(fix: bool):
        env = _env(row, **kw)
        await env.reset()
        listing, before = await _calls(env, ("list_files", {}), ("run_tests", {}))
        assert (
            f"calc.py ({len(MODULE)} bytes)" in listing and "pkg/data.txt" in listing and "0 passed, 1 failed" in before
        )
        if fix:
            await _calls(env, ("replace_in_file", {"path": "calc.py", "old": "a - b", "new": "a + b"}))
        reward = await env.reward()
        await env.close()
        return reward, env

    async def four():
        return await asyncio.gather(*(episode(i % 2 == 0) for i in range(4)))

    rewards = asyncio.run(four())
    assert [r for r, _ in rewards] == [1.0, 0.0, 1.0, 0.0]
    assert [p.name for p in cache.iterdir() if not p.name.startswith(".")] == [buggy]  # extracted once
    assert (cache / buggy / "calc.py").read_text() == MODULE  # never written
    assert rewards[0][1]._info()["workspace_ms"] > 0
    embedded = {**row["metadata"]["swe"], "files": {"calc.py": MODULE.replace("-", "+")}}
    env = _env({**row, "metadata": {"swe": embedded}}, **kw)

    async def fixed_by_the_row():
        await env.reset()
        try:
            return await env.reward()
        finally:
            await env.close()

    assert asyncio.run(fixed_by_the_row()) == 1.0
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
    with pytest.raises(ValueError, match="metadata.swe.base"):
        _env({**row, "metadata": {"swe": {"base": {"repo": "x"}, "tests": ["t"]}}})
    with pytest.raises(ValueError, match="files or a base"):
        _env({**row, "metadata": {"swe": {"tests": ["t"]}}})


def test_nothing_is_left_after_a_failed_episode(repo, tmp_path, monkeypatch):
    """The sandbox fails (infrastructure) mid-episode and the base of another row cannot be had:
    the episode's layer is gone after close all the same."""
    root, buggy, _ = repo

    async def broken(*args, **kwargs):
        return SandboxResult("", "", None, False, 0.01, infra_error="bwrap: cannot mount")

    monkeypatch.setattr(sb, "run_python", broken)
    row = {"prompt": "", "label": "", "metadata": {"swe": {"base": {"repo": str(root), "commit": buggy}}}}
    row["metadata"]["swe"]["tests"] = ["test_calc"]
    env = _env(row, base_cache=str(tmp_path / "cache"), workspace_dir=str(tmp_path))

    async def go():
        await env.reset()
        (out,) = await _calls(env, ("run_tests", {}))
        assert "failed to start" in out
        with pytest.raises(Exception, match="cannot mount"):
            await env.reward()
        await env.close()

    asyncio.run(go())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]
    bad = {**row, "metadata": {"swe": {**row["metadata"]["swe"], "base": {"repo": str(root), "commit": "2" * 40}}}}
    env = _env(bad, base_cache=str(tmp_path / "cache"), workspace_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="git"):
        asyncio.run(env.reset())
    asyncio.run(env.close())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(PREFIX)]


def test_the_merged_copy_never_writes_through_a_link_of_the_base(tmp_path):
    """The fallback where no overlay mounts: a copy of base + episode layer. A link in the base (absolute,
    into the base itself) must not carry the episode's file into the base; a file of the episode that
    replaces a base link wins, as the overlay shows it; folders merge."""
    from reinforge.sandbox.io import merged_copy

    base, upper = tmp_path / "base", tmp_path / "upper"
    (base / "real").mkdir(parents=True)
    (base / "real" / "a.py").write_text("base a\n")
    (base / "alias").symlink_to(base / "real")  # absolute link to a folder of the base
    (base / "rel.txt").symlink_to("real/a.py")
    (upper / "alias").mkdir(parents=True)
    (upper / "alias" / "new.py").write_text("episode\n")  # what Workspace.write_bytes('alias/new.py') leaves
    (upper / "rel.txt").write_text("episode file over a base link\n")
    (upper / "real").mkdir()
    (upper / "real" / "b.py").write_text("episode b\n")
    out = Path(merged_copy([str(base), str(upper)], [], str(tmp_path / "merged")))
    assert sorted(p.name for p in (base / "real").iterdir()) == ["a.py"]  # the base is unchanged
    assert (out / "alias" / "new.py").read_text() == "episode\n" and not (out / "alias").is_symlink()
    assert not (out / "rel.txt").is_symlink() and (out / "rel.txt").read_text().startswith("episode")
    assert sorted(p.name for p in (out / "real").iterdir()) == ["a.py", "b.py"]
