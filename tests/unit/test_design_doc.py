"""docs/design.md names the code as it is: in its embedded-engine section every ``Owner.name`` whose
owner is an engine class or module, and every private ``_name``, exists in reinforge/engine (issue 38
item 13: the page still named the old engine's private fields ``_gen_bound``, ``_admitted``,
``_Snapshot``, ``_h2d``); the functions it names in ``rollout/source.py`` and ``rollout/generate.py``
are defined there."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "reinforge" / "engine"


def _section(text: str, title: str) -> str:
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    return text[start : end if end > 0 else None]


def _defines(source: str, name: str) -> bool:
    """``name`` is a function, class, instance attribute or module-level name of ``source``."""
    return (
        re.search(rf"(^\s*(def|class) {name}\b)|(self\.{name}\b\s*(:[^=]*)?=)|(^{name}\b\s*(:[^=]*)?=)", source, re.M)
        is not None
    )


def test_the_engine_section_names_existing_engine_members():
    section = _section((ROOT / "docs" / "design.md").read_text(), "## The embedded engine")
    sources = {p.stem: p.read_text() for p in ENGINE.glob("*.py")}
    owners = dict(sources)  # a module name, or a class of one, -> the module's source
    del owners["engine"]  # `engine.x` is a config key (engine.kv_block_size); the class is EmbeddedEngine
    for text in sources.values():
        owners.update({m: text for m in re.findall(r"^class (\w+)", text, re.M)})
    checked, missing = 0, []
    for owner, name in re.findall(r"`([A-Za-z_]\w*)\.(_?[A-Za-z]\w*)(?:\(\))?`", section):
        if owner in owners:
            checked += 1
            if not _defines(owners[owner], name):
                missing.append(f"{owner}.{name}")
    everything = "\n".join(sources.values())
    for name in re.findall(r"`(_[A-Za-z]\w*)(?:\(\))?`", section):
        checked += 1
        if not _defines(everything, name):
            missing.append(name)
    assert checked >= 8, f"only {checked} names checked: has the section changed its form?"
    assert not missing, f"docs/design.md names engine members that do not exist: {missing}"


def test_the_two_generation_functions_are_named_for_what_they_do():
    design = (ROOT / "docs" / "design.md").read_text()
    source = (ROOT / "reinforge" / "rollout" / "source.py").read_text()
    generate = (ROOT / "reinforge" / "rollout" / "generate.py").read_text()
    assert _defines(source, "generate_and_score") and not _defines(source, "generate_groups")
    assert _defines(generate, "generate_groups")
    assert "source.py: generate_and_score" in design and "`generate_groups`: n unscored samples" in design
