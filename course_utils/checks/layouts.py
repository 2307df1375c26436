"""A module as plain data: its layout (submodules, parameters' and buffers' shapes, dtypes and flags, shared
tensors), and a module rebuilt from one.

Notebook 05's ``count_parameters`` takes a module: its cases cross into the grading kernel as plain data
(``probe.encode_cases``), so each module argument travels as its layout (:func:`module_layout`), checked
(:func:`layout_problem`) and rebuilt there (:func:`build_layout`); its values do not matter to the count.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

#: Tensor types a layout's parameters and buffers may have.
LAYOUT_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128",
                 "int8", "int16", "int32", "int64", "uint8", "bool")
#: Most modules, parameters and buffers in one layout, how deep its submodules nest, and most numbers
#: its tensors hold together (GPT-2 small's attention and its mask: 3.4 million).
MAX_LAYOUT_MODULES, MAX_LAYOUT_TENSORS, MAX_LAYOUT_DEPTH, MAX_LAYOUT_ELEMENTS = 256, 256, 16, 2**23


class BadLayout(ValueError):
    """A module layout that cannot be rebuilt; the message says why, in words."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def module_layout(module: torch.nn.Module) -> dict:
    """What a module is made of, as plain data (no class, no value): a tree of its submodules,
    ``{"parameters": [[name, shape, dtype, requires_grad, tied], ...], "buffers": [[name, shape, dtype,
    persistent, tied], ...], "children": [[name, <layout> | path], ...]}``, each list in registration
    order. ``tied`` is ``None``, or the dotted path of the earlier parameter (buffer) that is the same
    tensor; a child given as a path (``""``: the module itself) is the same module as the earlier one
    there. Enough to count parameters (trainable, frozen, shared once) and buffers as the module does;
    no class travels, so code that asks a submodule's class (``isinstance(m, nn.Linear)``) sees plain
    ``nn.Module`` containers in a module rebuilt from it.
    """
    modules: dict[int, str] = {}
    tensors: dict[str, dict[int, str]] = {"parameters": {}, "buffers": {}}

    def entries(kind: str, items: dict, prefix: str, flag: Callable[[str, torch.Tensor], bool]) -> list[list]:
        found = []
        for name, t in items.items():
            if t is None:  # a slot registered empty (nn.Linear(bias=False)'s bias): nothing to count
                continue
            seen = tensors[kind]
            found.append([name, list(t.shape), _dtype_name(t.dtype), flag(name, t), seen.get(id(t))])
            seen.setdefault(id(t), prefix + name)
        return found

    def walk(m: torch.nn.Module, path: str) -> dict:  # pre-order, own tensors first: as nn.Module walks
        modules[id(m)] = path
        prefix = f"{path}." if path else ""
        own = {"parameters": entries("parameters", m._parameters, prefix, lambda _, p: bool(p.requires_grad)),
               "buffers": entries("buffers", m._buffers, prefix, lambda n, _: n not in m._non_persistent_buffers_set)}
        own["children"] = [[name, modules[id(c)] if id(c) in modules else walk(c, prefix + name)]
                           for name, c in m._modules.items() if c is not None]
        return own

    return walk(module, "")


def _layout_name(name: Any) -> bool:
    """A name a layout's parameter, buffer or submodule may be rebuilt under: an identifier (no private
    one, nothing ``nn.Module`` has) or a position (``"0"``)."""
    return isinstance(name, str) and 0 < len(name) <= 100 and (name.isdigit() or (
        name.isidentifier() and not name.startswith("_") and not hasattr(torch.nn.Module, name)
        and name not in _MODULE_FIELDS))


_MODULE_FIELDS = frozenset(vars(torch.nn.Module()))  # what every module has (training, _parameters...)


def layout_problem(layout: Any) -> str | None:
    """What is wrong with a module layout (:func:`module_layout`'s form, within the ``MAX_LAYOUT_*``
    limits), or ``None``. Reads it as untrusted data: never builds anything."""
    import math

    count = {"modules": 0, "tensors": 0, "elements": 0}
    firsts: dict[str, dict[str, tuple]] = {"parameters": {}, "buffers": {}}  # path -> (shape, dtype, flag)
    paths: set[str] = set()

    def limits() -> str | None:  # checked as each part is read: shared parts of forged data cannot blow up
        if count["modules"] > MAX_LAYOUT_MODULES or count["tensors"] > MAX_LAYOUT_TENSORS:
            return f"over {MAX_LAYOUT_MODULES} modules or {MAX_LAYOUT_TENSORS} tensors"
        if count["elements"] > MAX_LAYOUT_ELEMENTS:
            return f"its tensors hold {count['elements']:,} numbers, over the limit of {MAX_LAYOUT_ELEMENTS:,}"
        return None

    def tensor_problem(kind: str, item: Any, prefix: str) -> str | None:
        if not (isinstance(item, list) and len(item) == 5 and _layout_name(item[0])):
            what = "requires_grad" if kind == "parameters" else "persistent"
            return f"a {kind[:-1]} is not [name, shape, dtype, {what}, tied] under a plain name"
        name, shape, dtype, flag, tied = item
        if not (isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
            return f"{kind[:-1]} {prefix + name!r} has a shape that is not a short list of sizes"
        if dtype not in LAYOUT_DTYPES or type(flag) is not bool:
            return f"{kind[:-1]} {prefix + name!r} has an unsupported dtype or a flag that is not True or False"
        if kind == "parameters" and flag and not dtype.startswith(("float", "bfloat", "complex")):
            return f"parameter {prefix + name!r} requires grad but is not floating point"
        count["tensors"] += 1
        if tied is not None:
            if firsts[kind].get(tied) != (shape, dtype, flag):
                return f"{kind[:-1]} {prefix + name!r} is tied to {str(tied)[:100]!r}, not an earlier one like it"
            return limits()
        firsts[kind][prefix + name] = (shape, dtype, flag)
        count["elements"] += math.prod(shape)
        return limits()

    def node_problem(node: Any, path: str, depth: int) -> str | None:
        if not (isinstance(node, dict) and set(node) == {"parameters", "buffers", "children"}
                and all(isinstance(v, list) for v in node.values())):
            return f"module {path!r} is not {{parameters, buffers, children}} lists"
        if depth > MAX_LAYOUT_DEPTH:
            return f"submodules nest deeper than {MAX_LAYOUT_DEPTH}"
        if sum(map(len, node.values())) > MAX_LAYOUT_TENSORS:
            return f"module {path!r} has over {MAX_LAYOUT_TENSORS} parameters, buffers and submodules"
        count["modules"] += 1
        if limits():
            return limits()
        paths.add(path)
        prefix, names = (f"{path}." if path else ""), set()
        for kind in ("parameters", "buffers"):
            for item in node[kind]:
                why = tensor_problem(kind, item, prefix)
                if why:
                    return why
                names.add(item[0])
        for item in node["children"]:
            if not (isinstance(item, list) and len(item) == 2 and _layout_name(item[0])):
                return f"a submodule of {path!r} is not [name, layout or path] under a plain name"
            names.add(item[0])
            child = item[1]
            if isinstance(child, str):
                if child not in paths:
                    return f"submodule {prefix + item[0]!r} is the same as {child[:100]!r}, not an earlier module"
            else:
                why = node_problem(child, prefix + item[0], depth + 1)
                if why:
                    return why
        if len(names) != len(node["parameters"]) + len(node["buffers"]) + len(node["children"]):
            return f"module {path!r} has two parameters, buffers or submodules of one name"
        return None

    return node_problem(layout, "", 0)


def build_layout(layout: Any) -> torch.nn.Module:
    """A module of the make-up ``layout`` describes (:func:`module_layout`): plain ``nn.Module``
    containers holding ``nn.Parameter``s and buffers of those names, shapes, dtypes and flags, filled
    with ones (values do not matter to what a layout is for), with the same tensors and submodules
    shared. So ``module_layout(build_layout(x)) == x``. :class:`BadLayout` says what is wrong with a
    malformed one, before anything is built."""
    why = layout_problem(layout)
    if why:
        raise BadLayout(f"not a module layout: {why}")
    modules: dict[str, torch.nn.Module] = {}
    tensors: dict[str, dict[str, torch.Tensor]] = {"parameters": {}, "buffers": {}}

    def made(kind: str, path: str, shape: list, dtype: str, flag: bool, tied: str | None) -> torch.Tensor:
        if tied is not None:
            return tensors[kind][tied]
        t = torch.ones(shape, dtype=getattr(torch, dtype))
        t = torch.nn.Parameter(t, requires_grad=flag) if kind == "parameters" else t
        tensors[kind][path] = t
        return t

    def build(node: dict, path: str) -> torch.nn.Module:
        module = modules[path] = torch.nn.Module()
        prefix = f"{path}." if path else ""
        for name, shape, dtype, flag, tied in node["parameters"]:
            module.register_parameter(name, made("parameters", prefix + name, shape, dtype, flag, tied))
        for name, shape, dtype, flag, tied in node["buffers"]:
            module.register_buffer(name, made("buffers", prefix + name, shape, dtype, flag, tied), persistent=flag)
        for name, child in node["children"]:
            module.add_module(name, modules[child] if isinstance(child, str) else build(child, prefix + name))
        return module

    return build(layout, "")
