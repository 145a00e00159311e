"""The package's structure: every module imports in a fresh interpreter, and the import graph
(module-level and function-level imports, not TYPE_CHECKING ones or lazy registry targets)
has no cycle, between modules nor between subpackages."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "reinforge"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = path.relative_to(PKG.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"
    )


def _imported_by_name(call: ast.Call) -> bool:
    """``importlib.import_module("reinforge...")`` (or ``import_module(...)``) with a literal name:
    an import like any other, not a way around this test."""
    f = call.func
    named = (isinstance(f, ast.Attribute) and f.attr == "import_module") or (
        isinstance(f, ast.Name) and f.id == "import_module"
    )
    first = call.args[0] if call.args else None
    return named and isinstance(first, ast.Constant) and str(first.value).startswith("reinforge")


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """reinforge modules that ``name`` imports at run time."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    if alias.name.startswith("reinforge"):
                        found.add(resolve(alias.name))
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - (child.level - 1)]
                    mod = ".".join(base + ([child.module] if child.module else []))
                else:
                    mod = child.module or ""
                if not mod.startswith("reinforge"):
                    continue
                for alias in child.names:  # "from . import checkpoint" imports a module
                    sub = f"{mod}.{alias.name}"
                    found.add(sub if sub in modules else resolve(mod))
            elif isinstance(child, ast.Call) and _imported_by_name(child):  # import_module("reinforge.x")
                found.add(resolve(child.args[0].value))  # type: ignore[attr-defined]
            visit(child)

    visit(ast.parse(path.read_text()))
    found.discard(None)
    found.discard(name)
    return found


def test_a_module_imported_by_name_is_an_import(tmp_path):
    """``importlib.import_module("reinforge.x")`` counts in the graph (issue 54: config reached
    into tools this way, out of this test's sight)."""
    mod = tmp_path / "m.py"
    mod.write_text(
        "import importlib\nfrom importlib import import_module\n\n\ndef f(name):\n"
        "    importlib.import_module('reinforge.tools.mcp')\n    import_module('reinforge.sandbox.runner')\n"
        "    importlib.import_module(name)  # not a literal: a registry target\n"
    )
    modules = _modules()
    assert _imports("reinforge.m", mod, modules) == {"reinforge.tools.mcp", "reinforge.sandbox.runner"}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def dfs(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m) :] + [m]
            if m not in state and (c := dfs(m)):
                return c
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (c := dfs(n)):
            return c
    return None


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {n: _imports(n, p, modules) for n, p in modules.items()}


def _layer(module: str) -> str:
    """reinforge.rollout.backends.embedded -> reinforge.rollout; reinforge.loop -> reinforge.loop."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_module_import_graph_has_no_cycle():
    cycle = _cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_subpackage_import_graph_has_no_cycle():
    """Subpackages form layers (utils, config, algo, models, data, rollout, weights, reward, train,
    eval, cluster, loop, cli): no subpackage imports one that imports it back."""
    layers: dict[str, set[str]] = {}
    for mod, deps in _graph().items():
        layers.setdefault(_layer(mod), set()).update(_layer(d) for d in deps if _layer(d) != _layer(mod))
    layers.pop("reinforge", None)  # the root __init__ re-exports nothing heavy
    cycle = _cycle(layers)
    assert cycle is None, "subpackage cycle: " + " -> ".join(cycle)


MAX_LINES = 600


def test_every_module_is_at_most_600_lines():
    """Small modules with one job: none over 600 lines (docs/design.md)."""
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    long = {n: k for n, k in long.items() if k > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_engine_layers_stay_apart():
    """The engine's scheduler is host-only (no torch), and the engine package never reaches up into
    the rollout layer that uses it."""
    lines = (PKG / "engine" / "scheduler.py").read_text().splitlines()
    assert not [line for line in lines if line.startswith(("import torch", "from torch"))]
    for mod, deps in _graph().items():
        if mod.startswith("reinforge.engine"):
            assert not any(d.startswith(("reinforge.rollout", "reinforge.train", "reinforge.loop")) for d in deps), mod


def test_every_module_imports_in_a_fresh_interpreter():
    names = sorted(n for n in _modules() if not n.endswith("__main__"))  # __main__ runs the CLI
    code = "import importlib, sys\nfor n in sys.argv[1:]:\n    importlib.import_module(n)\n"
    # reversed order too: a cycle shows up depending on which side is imported first
    for order in (names, names[::-1]):
        r = subprocess.run([sys.executable, "-c", code, *order], capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]


def test_adding_an_estimator_is_one_registered_function(tmp_path, tiny_model_path, monkeypatch):
    """docs/design.md's worked example: register an estimator, name it in the config, train."""
    import torch

    from reinforge.algo.advantages import ADV_ESTIMATORS, AdvantageInputs
    from reinforge.config import ConfigError, load_config
    from reinforge.loop import run_training
    from tests.integration.test_integration import tiny_overrides

    # registered for this test only (the registry feeds the config's choices and docs/config.md)
    monkeypatch.setattr(ADV_ESTIMATORS, "_entries", dict(ADV_ESTIMATORS._entries))

    @ADV_ESTIMATORS.register("my_baseline", group_based=True)
    def my_baseline(inputs: AdvantageInputs, algo) -> tuple[torch.Tensor, None]:
        r = inputs.outcome()
        adv = r - r.median(dim=1, keepdim=True).values
        return inputs.broadcast(adv), None

    overrides = tiny_overrides(
        tiny_model_path,
        tmp_path / "run",
        **{
            "algo.advantage_estimator": "my_baseline",
            "reward.type": "custom",
            "data.n_eval_prompts": 0,
            "reward.function_path": "tests.reward_fns:even_first_token",
            "train.num_rollout": 1,
            "run.save_final": "false",
        },
    )
    assert run_training(load_config(None, overrides)).last_rollout_id == 0
    try:
        load_config(None, ["algo.advantage_estimator=my_baseline", "n_samples_per_prompt=1"])
        raise AssertionError("group_based was not enforced")
    except ConfigError as e:
        assert "needs rollout.n_samples_per_prompt >= 2" in str(e)


def test_adding_a_backend_is_one_factory_and_a_registration(tiny_model_path, monkeypatch):
    """A backend registered under a new name is built by the one factory, from the config."""
    import torch

    from reinforge.config import load_config
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import load_tokenizer
    from reinforge.rollout.backends import BACKENDS, build_engine, engine_spec

    # registered for this test only (the registry feeds the config's choices and docs/config.md)
    monkeypatch.setattr(BACKENDS, "_entries", dict(BACKENDS._entries))
    BACKENDS.register("test_engine", "reinforge.rollout.backends.embedded:from_spec")
    cfg = load_config(None, [f"model.path={tiny_model_path}", "engine.backend=test_engine", "engine.max_num_seqs=4"])
    engine = build_engine(engine_spec(cfg, tiny_model_path, load_tokenizer(tiny_model_path), torch.device("cpu"), 64))
    assert isinstance(engine, EmbeddedEngine) and engine.num_slots == 4
    engine.shutdown()


FILE_EXTS = ("py", "md", "yaml", "json", "jsonl", "txt", "safetensors")
NOT_KEYS = {
    "engine.generate",
    "model.generate",
    "model.layers",
    "cluster.world_size",
}  # the last: the derived trainer world size, compared on resume (recover.py)


def test_each_config_section_has_a_module_of_its_own():
    """Issue 54: the config is split by concept, one module per section (``reinforge/config/engine.py`` holds
    ``EngineConfig``), except the sections of what is learned, one close group in ``learning.py``."""
    from reinforge.config import SECTIONS

    grouped = {"reward", "algo", "critic", "offline"}  # learning.py
    wrong = {
        name: cls.__module__
        for name, cls in SECTIONS.items()
        if cls.__module__ != f"reinforge.config.{'learning' if name in grouped else name}"
    }
    assert not wrong, wrong


def test_the_trainers_collectives_and_parallelize_are_apart():
    """Issue 54: ``train/parallel.py`` split on its seam: ``collectives.py`` talks between the ranks and places no
    model; ``parallelize.py`` places a model on the mesh and issues no collective of its own."""
    import inspect
    import re

    from reinforge.train import collectives, parallelize

    talks, places = inspect.getsource(collectives), inspect.getsource(parallelize)
    assert "fully_shard" not in talks and "def parallelize" not in talks
    assert not re.search(r"dist\.(all_reduce|all_gather|all_to_all|barrier|broadcast)", places)
    assert parallelize.parallelize.__module__ == "reinforge.train.parallelize"


def test_config_keys_named_in_messages_exist():
    """Every ``section.key`` that the package's strings (messages, help texts, docstrings) name is a
    real key, or the old spelling of a moved one: an error never names a key that does not exist."""
    import re

    from reinforge.config import SECTIONS
    from reinforge.config.loader import MOVED_KEYS, _section_fields

    modules = _modules()
    pattern = re.compile(r"(?<![\w./])(" + "|".join(SECTIONS) + r")\.([a-z_][a-z0-9_]*)\b(?![.(/])")
    unknown = set()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            for m in pattern.finditer(node.value):
                section, key = m.groups()
                if key in _section_fields(section) or (section, key) in MOVED_KEYS:
                    continue
                if f"reinforge.{section}.{key}" in modules or f"{section}.{key}" in NOT_KEYS or key in FILE_EXTS:
                    continue  # a module, a file, a method or a derived value
                if node.value[m.end() : m.end() + 1] == "*":
                    continue  # a family of keys (engine.sglang_*)
                unknown.add(f"{name}: {section}.{key}")
    assert not unknown, sorted(unknown)
