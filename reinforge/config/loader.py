"""Reading a configuration: defaults, a YAML file (and its ``base:``), ``key=value`` overrides.

Sources, later ones winning: the dataclass defaults, a YAML file (and the file named by its
top-level ``base:`` key, read first), ``key=value`` overrides from the command line. Keys are
written ``section.key`` (``rollout.n_samples_per_prompt=8``); a key that exists in exactly one
section may also be written bare (``n_samples_per_prompt=8``). Values of overrides are parsed
as YAML (``8`` is an int, ``[1, 2]`` a list, ``null`` None). Unknown keys and invalid values
raise :class:`ConfigError` naming the key and, where the value came from, the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from .fields import ConfigError
from .root import SECTIONS, Config

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- loading


class DuplicateKeyError(yaml.YAMLError):
    """A YAML mapping holds ``key`` twice (1-based lines ``first`` and ``second``)."""

    def __init__(self, key: Any, first: int, second: int):
        super().__init__(f"key {key!r} appears twice (lines {first} and {second})")
        self.key, self.first, self.second = key, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping holding the same key twice (PyYAML keeps the last
    value silently, so a second ``lr:`` in a section would quietly win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                line = first.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if line != key_node.start_mark.line + 1:
                raise DuplicateKeyError(key, line, key_node.start_mark.line + 1)
        return super().construct_mapping(node, deep=deep)


def load_yaml_unique(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing duplicated keys of a mapping.

    Raises:
        DuplicateKeyError: a mapping holds a key twice (its lines in the error).
        yaml.YAMLError: not valid YAML.
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def _type_name(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:  # `int | Literal["auto"]`: "int or 'auto'"
        return " or ".join(repr(c) for c in typing.get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


_SCALARS: dict[type, tuple[Any, str]] = {  # type -> (accepts value?, what the error says is expected)
    bool: (lambda v: isinstance(v, bool), "true or false"),
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    str: (lambda v: isinstance(v, str), "a string"),
}


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` (int -> float allowed); return the value."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        if len(errors) == 1:  # `X | None`: X's own message (a Literal's allowed values), or null
            raise ConfigError(f"{errors[0]} (or null)")
        raise ConfigError(f"{key}: expected {' or '.join(_type_name(a) for a in args)}, got {value!r}")
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and ("on" if value else "off") in choices:
            value = "on" if value else "off"  # YAML 1.1 reads `off` / `on` as booleans
        if value not in choices:
            import difflib

            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: {value!r} is not one of {list(choices)}{hint}")
        return value
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if tp in _SCALARS:
        accepts, expected = _SCALARS[tp]
        if not accepts(value):
            raise ConfigError(f"{key}: expected {expected}, got {value!r}")
        return float(value) if tp is float else value
    raise ConfigError(f"{key}: unsupported type {tp}")


def _section_fields(section: str) -> dict[str, Any]:
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


# Keys that moved to another section (and maybe a new name): their old spelling is still read (user
# configs, the config.yaml of older runs and checkpoints), with a warning naming the new key.
# (old section, old name) -> (new section, new name).
MOVED_KEYS: dict[tuple[str, str], tuple[str, str]] = {
    **{
        ("rollout", name): ("engine", name)
        for name in (
            "backend",
            "dtype",
            "max_num_seqs",
            "kv_cache_memory_fraction",
            "max_prefill_tokens",
            "sync_interval",
            "overlap_schedule",
            "cuda_graph",
            "kv_block_size",
            "num_kv_blocks",
            "sglang_urls",
            "sglang_server_args",
            "sglang_router",
            "sglang_weight_update",
            "sglang_host",
            "sglang_port_base",
            "sglang_launch_timeout",
        )
    },
    **{
        ("reward", f"judge_{name}"): ("judge", name)
        for name in (
            "url",
            "model",
            "model_path",
            "max_num_seqs",
            "max_len",
            "max_new_tokens",
            "offload_weights",
            "template",
            "score_regex",
            "max_score",
            "verdicts",
            "retries",
            "cache_size",
        )
    },
    ("agent", "python_sandbox"): ("sandbox", "backend"),
    ("agent", "python_memory_mb"): ("sandbox", "memory_mb"),
    ("agent", "python_max_open_files"): ("sandbox", "max_open_files"),
    ("agent", "python_sandbox_uid"): ("sandbox", "uid"),
    ("agent", "python_sandbox_uids"): ("sandbox", "num_uids"),
    ("agent", "max_concurrent_sandboxes"): ("sandbox", "max_concurrent"),
}
_warned_moved: set[str] = set()


def _moved(old: str, new: tuple[str, str]) -> tuple[str, str]:
    """``new``, the place of the old spelling ``old``; the first use of each old spelling logs a warning."""
    if old not in _warned_moved:
        _warned_moved.add(old)
        log.warning(
            f"config key {old} is now written {'.'.join(new)} (docs/config.md#{new[0]}); the old spelling is "
            f"still read for now: rename it"
        )
    return new


def _locate(key: str) -> tuple[str, str]:
    """'rollout.n_samples_per_prompt' or a bare unique 'n_samples_per_prompt' -> (section, name).
    A key's old spelling (:data:`MOVED_KEYS`, dotted or bare) gives its new place, with a warning."""
    if "." in key:
        section, name = key.split(".", 1)
        if (section, name) in MOVED_KEYS:
            return _moved(key, MOVED_KEYS[(section, name)])
        if section not in SECTIONS:
            raise ConfigError(
                f"unknown config section {section!r} in {key!r}; sections: {', '.join(SECTIONS)}"
                + _suggest(section, SECTIONS)
            )
        if name not in _section_fields(section):
            raise ConfigError(f"unknown config key {key!r}" + _suggest(name, _section_fields(section), section))
        return section, name
    owners = [s for s in SECTIONS if key in _section_fields(s)]
    if len(owners) == 1:
        return owners[0], key
    moved = [old for old in MOVED_KEYS if old[1] == key]
    if not owners and len(moved) == 1:
        return _moved(".".join(moved[0]), MOVED_KEYS[moved[0]])
    if len(owners) > 1:
        raise ConfigError(f"config key {key!r} is ambiguous: write one of {', '.join(f'{s}.{key}' for s in owners)}")
    every = {f"{s}.{n}" for s in SECTIONS for n in _section_fields(s)}
    bare = {n for s in SECTIONS for n in _section_fields(s)}
    raise ConfigError(f"unknown config key {key!r}" + _suggest(key, bare | every))


def _suggest(name: str, options, section: str | None = None) -> str:
    close = difflib.get_close_matches(name, list(options), n=3, cutoff=0.6)
    if not close:
        return ""
    prefix = f"{section}." if section else ""
    return "; did you mean " + " or ".join(f"{prefix}{c}" for c in close) + "?"


def _flatten(raw: dict[str, Any], origin: str) -> list[tuple[str, Any]]:
    """YAML mapping -> [(dotted key, value)]; sections are mappings, bare keys are allowed."""
    out: list[tuple[str, Any]] = []
    for k, v in raw.items():
        if not isinstance(k, str):
            raise ConfigError(f"{origin}: key {k!r} is not a string")
        if k in SECTIONS:
            if v is None:
                continue
            if not isinstance(v, dict):
                raise ConfigError(f"{origin}: section {k!r} must be a mapping of keys to values")
            out.extend((f"{k}.{name}", value) for name, value in v.items())
        else:
            out.append((k, v))
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """'rollout.n_samples_per_prompt=8' -> ('rollout.n_samples_per_prompt', 8)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key=value (e.g. train.lr=1e-6)")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-").replace("-", "_")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and _looks_numeric(value):  # YAML reads 1e-6 as a string
        value = float(value)
    return key, value


def _looks_numeric(s: str) -> bool:
    try:
        float(s)
        return s.strip().lower() not in ("nan", "inf", "-inf", "infinity")
    except ValueError:
        return False


def load_config(path: str | Path | None = None, overrides: list[str] | None = None) -> Config:
    """Build a validated :class:`Config` from defaults, an optional YAML file and overrides.

    Raises:
        ConfigError: unknown key, wrong type or invalid combination (the message names the
            key and the file or ``command line`` it came from).
        FileNotFoundError: ``path`` does not exist.
    """
    values: dict[tuple[str, str], tuple[Any, str]] = {}
    if path is not None:
        _read_yaml(Path(path), values, seen=())
    spelled: dict[tuple[str, str], str] = {}  # how the command line wrote each key
    for text in overrides or []:
        key, value = parse_override(text)
        try:
            located = _locate(key)
        except ConfigError as e:
            raise ConfigError(f"command line: {e}") from None
        first = spelled.setdefault(located, key)
        if _is_old_spelling(first, located) != _is_old_spelling(key, located):
            raise ConfigError(
                f"command line: {'.'.join(located)} is given twice (as {first!r} and as {key!r}, its old spelling); "
                f"only one value can hold: delete one of them"
            )
        values[located] = (value, "command line")
    return config_from_values(values)


def _is_old_spelling(key: str, located: tuple[str, str]) -> bool:
    """Whether ``key`` (dotted or bare) names ``located`` by an old spelling of :data:`MOVED_KEYS`."""
    return key not in (".".join(located), located[1])


def read_utf8(path: Path) -> str:
    """The text of ``path``, which must be UTF-8.

    Raises:
        ConfigError: a byte sequence that is not UTF-8, naming the file, line and column.
    """
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ConfigError(
            f"{path}:{line}: byte 0x{data[e.start]:02x} at column {column} is not UTF-8 text "
            f"({e.reason}); save the file as UTF-8"
        ) from None


def _read_yaml(path: Path, values: dict[tuple[str, str], tuple[Any, str]], seen: tuple[Path, ...]) -> None:
    """Add a YAML file's keys to ``values``; a top-level ``base: other.yaml`` (relative to the
    file) is read first, so the file only states what differs from its base."""
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} not found")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'base' files include each other")
    try:
        raw = load_yaml_unique(read_utf8(path)) or {}
    except DuplicateKeyError as e:
        raise ConfigError(
            f"{path}:{e.second}: key {e.key!r} is given twice (first on line {e.first}); YAML would keep only "
            f"the last value silently: delete one of them"
        ) from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of sections")
    base = raw.pop("base", None)
    if base is not None:
        if not isinstance(base, str):
            raise ConfigError(f"{path}: base must be a path to another YAML file")
        _read_yaml(path.parent / base, values, seen + (path.resolve(),))
    own: dict[tuple[str, str], str] = {}  # keys of this file: `lr` and `train: {lr}` are one key
    for key, value in _flatten(raw, str(path)):
        try:
            located = _locate(key)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None
        if located in own:
            raise ConfigError(
                f"{path}: {'.'.join(located)} is given twice (as {own[located]!r} and as {key!r}); only one value "
                f"can hold: delete one of them"
            )
        own[located] = key
        values[located] = (value, str(path))


def config_from_values(values: dict[tuple[str, str], tuple[Any, str]], check_explicit: bool = True) -> Config:
    sections = {}
    for section, cls in SECTIONS.items():
        hints = _section_fields(section)
        kwargs = {}
        for (s, name), (value, origin) in values.items():
            if s != section:
                continue
            if isinstance(value, str) and hints[name] in (float, float | None) and _looks_numeric(value):
                value = float(value)  # YAML reads 1e-6 (no dot) as a string
            try:
                kwargs[name] = _coerce(value, hints[name], f"{section}.{name}")
            except ConfigError as e:
                raise ConfigError(f"{origin}: {e}") from None
        sections[section] = cls(**kwargs)
    cfg = Config(**sections)
    if check_explicit:
        _check_explicit_keys(cfg, set(values))
    return cfg.validate()


def unused_keys(cfg: Config) -> dict[tuple[str, str], str]:
    """Keys the configuration does not read, each with why, which may not be set explicitly:
    ``critic.*`` without a critic, and ``algo`` keys that only other advantage estimators read
    (each estimator's registration lists the keys it reads). :func:`dump_config` leaves them out
    so a written config loads again."""
    from ..algo.registries import ADV_ESTIMATORS

    est = cfg.algo.advantage_estimator
    out: dict[tuple[str, str], str] = {}
    if not cfg.algo.needs_critic:
        for name in _section_fields("critic"):
            out[("critic", name)] = f"algo.advantage_estimator={est} uses no critic"
    reads = {name: set(ADV_ESTIMATORS.info(name).get("reads", ())) for name in ADV_ESTIMATORS}
    for key in sorted(set().union(*reads.values())):
        if key not in reads[est]:
            users = ", ".join(n for n in reads if key in reads[n])
            out[("algo", key)] = f"algo.advantage_estimator={est} does not use it (it applies to {users})"
    return out


def _check_explicit_keys(cfg: Config, given: set[tuple[str, str]]) -> None:
    """Refuse settings that the chosen advantage estimator would silently ignore (:func:`unused_keys`)."""
    unused = unused_keys(cfg)
    critic_keys = sorted(f"critic.{n}" for s, n in given if s == "critic" and ("critic", n) in unused)
    if critic_keys:
        raise ConfigError(
            f"{', '.join(critic_keys)} set, but algo.advantage_estimator="
            f"{cfg.algo.advantage_estimator} uses no critic: use advantage_estimator=gae (PPO with a "
            f"critic) or remove them"
        )
    for section, key in sorted(given):
        if section == "algo" and (section, key) in unused:
            raise ConfigError(f"algo.{key} set, but {unused[(section, key)]}: remove it or change the estimator")


def config_from_dict(d: dict[str, Any]) -> Config:
    """Inverse of :meth:`Config.to_dict` (used when resuming from a checkpoint)."""
    values = {}
    for key, value in _flatten(d, "config"):
        values[_locate(key)] = (value, "saved config")
    return config_from_values(values, check_explicit=False)


def config_dict(cfg: Config, changed_only: bool = False) -> dict[str, dict[str, Any]]:
    """``cfg`` as ``{section: {key: value}}`` that :func:`load_config` accepts again: the keys of
    :func:`unused_keys` (refused when set explicitly) are left out, and so are sections left empty.

    Args:
        changed_only: keep only the keys whose value differs from the default.
    """
    unused = unused_keys(cfg)
    out: dict[str, dict[str, Any]] = {}
    for section, cls in SECTIONS.items():
        values = dataclasses.asdict(getattr(cfg, section))
        default = dataclasses.asdict(cls()) if changed_only else {}
        kept = {
            k: v for k, v in values.items() if (section, k) not in unused and not (changed_only and default.get(k) == v)
        }
        if kept:
            out[section] = kept
    return out


def config_yaml(cfg: Config, changed_only: bool = False) -> str:
    """:func:`config_dict` as YAML text (sections in :data:`SECTIONS` order)."""
    d = config_dict(cfg, changed_only)
    return yaml.safe_dump(d, sort_keys=False) if d else "{}\n"


def dump_config(cfg: Config, path: str | Path) -> None:
    """Write the resolved config to ``path`` (a run's ``config.yaml``) as :func:`config_yaml`:
    every key but those the run does not read, so ``reinforge train / eval / offline -c path``
    loads it again. It describes the run, not the act of starting it: ``run.load`` and
    ``run.overwrite`` are written as their defaults (a config that kept ``run.load`` would make
    ``eval -c`` load the checkpoint and a new run from it silently continue the old one). The file
    is replaced atomically."""
    from ..utils.fs import atomic_write_text

    run = dataclasses.replace(cfg.run, load=None, overwrite=False)
    atomic_write_text(
        Path(path),
        "# the resolved config of this run (keys it does not read are left out; "
        "docs/config.md)\n" + config_yaml(dataclasses.replace(cfg, run=run)),
    )
