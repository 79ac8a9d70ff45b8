"""Describe a real TensorRT binding module as JSON (run in a subprocess: two versions of one binding cannot share a
process). ``python tests/trt_api_probe.py IMPORT_NAME`` prints {"version", "file", "names": {name: description}}.

A class is described by its public members: enums by their member names, methods by the parameter counts of their
pybind11 overloads (read from the docstrings), properties as properties.
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys

_SIG = re.compile(r"^\s*(?:\d+\.\s*)?(\w+)\((.*)\)\s*->", re.M)


def _param_counts(name: str, doc: str) -> list[int]:
    counts = []
    for m in _SIG.finditer(doc or ""):
        if m.group(1) != name:
            continue
        params = m.group(2).strip()
        if params in ("*args, **kwargs",):
            continue
        depth, parts, cur = 0, [], ""
        for ch in params:
            depth += ch in "([{"
            depth -= ch in ")]}"
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        if cur.strip():
            parts.append(cur)
        parts = [p.strip() for p in parts]
        if parts and parts[0].startswith("self"):
            parts = parts[1:]
        counts.append({"n": len(parts), "required": sum("=" not in p for p in parts)})
    return counts


def describe_class(cls) -> dict:
    out = {"kind": "class", "members": {}}
    enum_members = getattr(cls, "__members__", None)
    if isinstance(enum_members, dict) and enum_members:
        out["kind"] = "enum"
        out["enum"] = sorted(enum_members)
    for name in dir(cls):
        if name.startswith("_") and name != "__init__":
            continue
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if isinstance(raw, property) or type(raw).__name__ in ("property", "getset_descriptor"):
            out["members"][name] = {"kind": "property"}
        elif isinstance(raw, type):
            out["members"][name] = describe_class(raw)
        elif callable(raw) or type(raw).__name__ in ("instancemethod", "builtin_function_or_method",
                                                      "staticmethod", "classmethod"):
            doc = getattr(getattr(cls, name), "__doc__", "") or ""
            out["members"][name] = {"kind": "method", "overloads": _param_counts(name, doc)}
        else:
            out["members"][name] = {"kind": "value"}
    return out


def describe(import_name: str) -> dict:
    module = importlib.import_module(import_name)
    names = {}
    for name in dir(module):
        if name.startswith("_"):
            continue
        obj = getattr(module, name)
        if isinstance(obj, type):
            names[name] = describe_class(obj)
        elif callable(obj):
            names[name] = {"kind": "function"}
        else:
            names[name] = {"kind": "value"}
    return {"import_name": import_name, "version": str(getattr(module, "__version__", "?")),
            "file": str(getattr(module, "__file__", "?")), "names": names}


if __name__ == "__main__":
    try:
        print(json.dumps(describe(sys.argv[1])))
    except Exception as exc:  # the caller reports why (e.g. a missing shared library)
        print(json.dumps({"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}))
