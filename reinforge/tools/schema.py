"""A tool's JSON schema from its Python signature (or from the schema an MCP server lists), and
argument checking against it.

A tool is a plain function with type hints and a Google-style docstring::

    def search(query: str, max_results: int = 5) -> str:
        \"\"\"Search the web.

        Args:
            query: what to look for.
            max_results: how many hits to return.
        \"\"\"

:func:`function_schema` turns it into the OpenAI / Hugging Face function-calling schema that chat
templates take as ``tools=`` (the same layout as ``transformers.utils.get_json_schema``)::

    {"type": "function", "function": {"name": "search", "description": "Search the web.",
     "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": ...},
                    "max_results": {"type": "integer", "description": ..., "default": 5}},
                    "required": ["query"]}}}

Supported hints: ``str int float bool``, ``list[T]``, ``dict``, ``Literal[...]`` (an ``enum``),
``T | None`` (nullable, not required when it has a default) and ``Any``.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class ToolArgumentError(ValueError):
    """Arguments that do not fit a tool's schema; the message says which and why."""


def function_schema(tool: Callable[..., Any] | Mapping[str, Any], name: str | None = None) -> dict[str, Any]:
    """The function-calling schema (layout in the module docstring) of ``tool`` under ``name``
    (default: the function's name, or the listed tool's):

    - a Python function: the description is its docstring's text before the first section
      (``Args:``, ``Returns:``...), each parameter's description comes from the ``Args:`` section,
      the types from the type hints;
    - a tool an MCP server listed, ``{name, description, input_schema}``: its JSON schema, with the
      ``title`` keys dropped and ``null`` alternatives (``type: [T, null]``, ``anyOf: [{T}, {type:
      null}]``) written as ``nullable``, as the type hints' ``T | None`` are.

    Raises:
        TypeError: a function parameter without a type hint, a ``*args`` / ``**kwargs`` parameter,
            or a hint that has no JSON schema.
    """
    if isinstance(tool, Mapping):
        params = _listed(dict(tool.get("input_schema") or {}))
        params["type"] = "object"
        params.setdefault("properties", {})
        description = (tool.get("description") or "").strip()
        return _envelope(name or tool["name"], description, params)
    return _envelope(name or tool.__name__, *_from_function(tool))


def _envelope(name: str, description: str, params: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}


def _from_function(fn: Callable[..., Any]) -> tuple[str, dict[str, Any]]:
    """``(description, parameters schema)`` of a Python function (see :func:`function_schema`)."""
    doc = inspect.getdoc(fn) or ""
    description, arg_docs = parse_google_docstring(doc)
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {fn.__name__}: *args / **kwargs have no JSON schema")
        if p.name not in hints:
            raise TypeError(f"tool {fn.__name__}: parameter {p.name!r} needs a type hint")
        prop = _type_schema(hints[p.name], f"{fn.__name__}({p.name})")
        if p.name in arg_docs:
            prop["description"] = arg_docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        else:
            prop["default"] = p.default
        properties[p.name] = prop
    params: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    return description, params


def parse_google_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """``(description, {arg: description})`` of a Google-style docstring.

    The description is everything before the first ``Section:`` line; argument descriptions
    may continue on more-indented lines.
    """
    lines = doc.splitlines()
    section = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
    head: list[str] = []
    i = 0
    while i < len(lines) and not section.match(lines[i]):
        head.append(lines[i])
        i += 1
    args: dict[str, str] = {}
    current: str | None = None
    in_args = False
    indent = None
    for line in lines[i:]:
        m = section.match(line)
        if m:
            in_args = m.group(1) in ("Args", "Arguments", "Parameters")
            current, indent = None, None
            continue
        if not in_args or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        item = re.match(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if item and (indent is None or width <= indent):
            indent = width
            current = item.group(1)
            args[current] = item.group(2).strip()
        elif current is not None:
            args[current] = (args[current] + " " + line.strip()).strip()
    return " ".join(" ".join(head).split()), args


def _type_schema(tp: Any, where: str) -> dict[str, Any]:
    if tp is Any:
        return {}
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"tool {where}: unions other than `T | None` have no JSON schema")
        return {**_type_schema(args[0], where), "nullable": True}
    if origin is Literal:
        values = list(typing.get_args(tp))
        kinds = {type(v) for v in values}
        out: dict[str, Any] = {"enum": values}
        if len(kinds) == 1 and kinds.pop() in _JSON_TYPES:
            out["type"] = _JSON_TYPES[type(values[0])]
        return out
    if origin in (list, tuple):
        items = typing.get_args(tp)
        out = {"type": "array"}
        if origin is list and items:
            out["items"] = _type_schema(items[0], where)
        return out
    if origin is dict or tp is dict:
        return {"type": "object"}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    raise TypeError(f"tool {where}: type {tp!r} has no JSON schema")


def check_arguments(schema: dict[str, Any], arguments: Any) -> dict[str, Any]:
    """``arguments`` checked against a function schema's ``parameters``.

    Integral floats are accepted for ``integer`` (``3.0`` -> ``3``) and integers for
    ``number``; nothing else is converted.

    Returns:
        the arguments (a new dict).

    Raises:
        ToolArgumentError: not a mapping, a required argument missing, an unknown argument, or a
            value of the wrong type / outside its ``enum``.
    """
    if not isinstance(arguments, dict):
        raise ToolArgumentError(f"arguments must be a JSON object, got {type(arguments).__name__}")
    params = schema["function"]["parameters"]
    props = params.get("properties", {})
    unknown = sorted(set(arguments) - set(props))
    if unknown:
        raise ToolArgumentError(
            f"unknown argument(s) {', '.join(map(repr, unknown))}; "
            f"the tool takes {', '.join(map(repr, props)) or 'none'}"
        )
    missing = [k for k in params.get("required", []) if k not in arguments]
    if missing:
        raise ToolArgumentError(f"missing required argument(s) {', '.join(map(repr, missing))}")
    return {k: _check_value(props[k], v, k) for k, v in arguments.items()}


def _check_value(prop: dict[str, Any], value: Any, key: str) -> Any:
    if value is None:
        if prop.get("nullable"):
            return None
        raise ToolArgumentError(f"argument {key!r} must not be null")
    if "enum" in prop and value not in prop["enum"]:
        raise ToolArgumentError(f"argument {key!r} must be one of {prop['enum']}, got {value!r}")
    kind = prop.get("type")
    ok = {
        None: True,
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "integer": isinstance(value, int)
        and not isinstance(value, bool)
        or isinstance(value, float)
        and value.is_integer(),
        "number": isinstance(value, (int, float)) and not isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(kind, True)
    if not ok:
        raise ToolArgumentError(f"argument {key!r} must be of type {kind}, got {type(value).__name__} {value!r:.80}")
    if kind == "integer":
        return int(value)
    if kind == "array" and "items" in prop:
        return [_check_value(prop["items"], v, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _listed(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    out = {k: v for k, v in schema.items() if k != "title"}
    kind = out.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) < len(kind):
            out["nullable"] = True
        if len(kinds) == 1:
            out["type"] = kinds[0]
        else:  # several types: an anyOf, which the argument check leaves to the server
            del out["type"]
            out["anyOf"] = [{"type": k} for k in kinds]
    options = out.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if o != {"type": "null"}]
        if len(rest) < len(options):
            out["nullable"] = True
            if len(rest) == 1 and isinstance(rest[0], dict):
                del out["anyOf"]
                out = {**_listed(rest[0]), **out}
            else:
                out["anyOf"] = rest
        if "anyOf" in out:
            out["anyOf"] = [_listed(o) for o in out["anyOf"]]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _listed(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = _listed(out["items"])
    return out
