"""docs/img/architecture.dot (the picture on docs/design.md) names only code that exists: every module
path (``pkg/``, ``pkg/file.py``, a bare ``file.py``) is a folder or file of reinforge/, and every
``Class.method`` a method of that class (issue 54: the picture still drew ``Cluster.train_actor`` and the
advantages on the driver after both had moved to the trainer ranks)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "reinforge"
PICTURE = ROOT / "docs" / "img" / "architecture.dot"


def _labels() -> str:
    """The text the picture shows: its ``label="..."`` strings (not the dot syntax or comments)."""
    return "\n".join(re.findall(r'label="((?:[^"\\]|\\.)*)"', PICTURE.read_text())).replace("\\n", "\n")


def _class_bodies() -> dict[str, str]:
    """Class name -> the source of its body (to the next top-level statement), over reinforge/."""
    bodies: dict[str, str] = {}
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        for m in re.finditer(r"^class (\w+)\b.*?(?=^\S|\Z)", text, re.M | re.S):
            bodies.setdefault(m.group(1), "")
            bodies[m.group(1)] += m.group(0)
    return bodies


def test_every_module_path_of_the_picture_exists():
    text = _labels()
    paths = set(re.findall(r"(?<![\w./])([a-z_][a-z0-9_]*(?:/[a-z_][a-z0-9_]*)*(?:/|\.py))(?![\w/])", text))
    assert len(paths) >= 10, f"only {sorted(paths)}: has the picture changed its form?"
    files = {p.name for p in PACKAGE.rglob("*.py")}
    missing = [
        p
        for p in sorted(paths)
        if not ((PACKAGE / p).exists() if "/" in p else p in files)  # a bare file name: anywhere in the package
    ]
    assert not missing, f"docs/img/architecture.dot names modules that do not exist in reinforge/: {missing}"


def test_every_class_method_of_the_picture_exists():
    text = _labels()
    bodies = _class_bodies()
    pairs = set(re.findall(r"\b([A-Z][A-Za-z0-9]+)\.([a-z_][a-z0-9_]*)\b", text))
    pairs = {(c, m) for c, m in pairs if m != "py"}
    assert len(pairs) >= 8, f"only {sorted(pairs)}: has the picture changed its form?"
    missing = [
        f"{c}.{m}"
        for c, m in sorted(pairs)
        if c not in bodies or not re.search(rf"^\s+(async )?def {m}\b", bodies[c], re.M)
    ]
    assert not missing, f"docs/img/architecture.dot names methods that do not exist: {missing}"
