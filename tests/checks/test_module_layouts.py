"""A module as plain data (``layouts.module_layout``) and rebuilt from it (``layouts.build_layout``): what
notebook 05's ``count_parameters`` is given under the grader (issue 18).

A layout keeps what a count reads (submodules, parameters with ``requires_grad``, buffers with their
persistence, tensors and submodules shared), rebuilds to a module of the same make-up, and is read as
untrusted data: a malformed or oversized one is refused with its reason, before anything is built.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from torch import nn

from course_utils.checks import layouts, probe


def _tied() -> nn.Module:
    tied = nn.Sequential(nn.Linear(5, 5, bias=False), nn.Linear(5, 5, bias=False))
    tied[1].weight = tied[0].weight
    return tied


def _frozen() -> nn.Module:
    frozen = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    frozen[0].requires_grad_(False)
    return frozen


def _buffers() -> nn.Module:
    module = nn.Module()
    module.proj = nn.Linear(3, 3)
    module.register_buffer("mask", torch.ones(6, 6, dtype=torch.bool).triu(1))
    module.register_buffer("scratch", torch.zeros(2, dtype=torch.int64), persistent=False)
    module.register_buffer("empty", None)
    return module


def _shared_module() -> nn.Module:
    head = nn.Linear(2, 2)
    return nn.ModuleList([head, nn.Linear(2, 2), head])


def _frozen_attention() -> nn.Module:
    attention = nn.MultiheadAttention(8, 2, batch_first=True)
    attention.out_proj.requires_grad_(False)
    return attention


MODULES = {
    "two layers sharing one weight": _tied,
    "a frozen first layer": _frozen,
    "buffers, persistent or not": _buffers,
    "a module without parameters": nn.ReLU,
    "one submodule held twice": _shared_module,
    "nn.MultiheadAttention with a frozen out_proj": _frozen_attention,
}


def _make_up(module: nn.Module) -> dict:
    """What a count can read of a module, as numbers and names."""
    return {
        "trainable": sum(p.numel() for p in module.parameters() if p.requires_grad),
        "all": sum(p.numel() for p in module.parameters()),
        "tensors": len(list(module.parameters())),
        "own each": sum(p.numel() for m in module.modules() for p in m.parameters(recurse=False)),
        "state_dict": {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()},
        "buffers": [(n, tuple(b.shape), b.dtype) for n, b in module.named_buffers()],
        "parameters": [(n, tuple(p.shape), p.dtype, p.requires_grad) for n, p in module.named_parameters()],
        "modules": [n for n, _ in module.named_modules()],
    }


@pytest.mark.parametrize("make", MODULES.values(), ids=MODULES.keys())
def test_a_layout_rebuilds_a_module_of_the_same_make_up(make):
    module = make()
    layout = layouts.module_layout(module)
    json.dumps(layout)  # plain data: no tensor, no class
    rebuilt = layouts.build_layout(layout)
    assert layouts.module_layout(rebuilt) == layout
    assert _make_up(rebuilt) == _make_up(module)
    assert all(type(m) is nn.Module for m in rebuilt.modules())  # no class is taken from the data


def test_shared_tensors_and_submodules_stay_shared():
    tied = layouts.build_layout(layouts.module_layout(_tied()))
    first, second = (getattr(tied, n) for n in ("0", "1"))  # plain containers: reached by name
    assert second.weight is first.weight and len(list(tied.parameters())) == 1
    shared = layouts.build_layout(layouts.module_layout(_shared_module()))
    assert getattr(shared, "2") is getattr(shared, "0") and getattr(shared, "1") is not getattr(shared, "0")
    buffers = layouts.build_layout(layouts.module_layout(_buffers()))
    assert set(buffers.state_dict()) == {"proj.weight", "proj.bias", "mask"}
    assert buffers.scratch.dtype == torch.int64 and buffers.mask.dtype == torch.bool


def test_a_layout_says_what_a_count_needs():
    layout = layouts.module_layout(_tied())
    assert layout["children"][1][1]["parameters"] == [["weight", [5, 5], "float32", True, "0.weight"]]
    frozen = layouts.module_layout(_frozen())
    assert frozen["children"][0][1]["parameters"][0] == ["weight", [3, 4], "float32", False, None]
    assert layouts.module_layout(nn.ReLU()) == {"parameters": [], "buffers": [], "children": []}
    assert layouts.module_layout(_buffers())["buffers"] == [["mask", [6, 6], "bool", True, None],
                                                         ["scratch", [2], "int64", False, None]]


def _deep(levels: int) -> dict:
    node = {"parameters": [], "buffers": [], "children": []}
    for _ in range(levels):
        node = {"parameters": [], "buffers": [], "children": [["inner", node]]}
    return node


def _aliased(levels: int) -> dict:
    """A layout whose every module holds the same child twice: tiny as data, 2**levels modules as a tree."""
    node = {"parameters": [["w", [1], "float32", True, None]], "buffers": [], "children": []}
    for _ in range(levels):
        node = {"parameters": [], "buffers": [], "children": [["a", node], ["b", node]]}
    return node


def _with(change) -> dict:
    layout = copy.deepcopy(layouts.module_layout(_buffers()))
    change(layout)
    return layout


MALFORMED = {
    "not a mapping": (["parameters"], "is not {parameters, buffers, children} lists"),
    "another field": (_with(lambda l: l.__setitem__("cls", "CausalAttention")), "is not {parameters, buffers"),
    "a parameter of four fields": (_with(lambda l: l["children"][0][1]["parameters"][0].pop()),
                                   "not [name, shape, dtype, requires_grad, tied]"),
    "a private name": (_with(lambda l: l["children"][0][1]["parameters"][0].__setitem__(0, "_parameters")),
                       "under a plain name"),
    "a name nn.Module has": (_with(lambda l: l["buffers"][0].__setitem__(0, "training")), "under a plain name"),
    "a dotted name": (_with(lambda l: l["children"][0].__setitem__(0, "proj.weight")), "under a plain name"),
    "a negative size": (_with(lambda l: l["buffers"][0].__setitem__(1, [-1, 6])), "not a short list of sizes"),
    "a shape as text": (_with(lambda l: l["buffers"][0].__setitem__(1, "6x6")), "not a short list of sizes"),
    "an unknown dtype": (_with(lambda l: l["buffers"][0].__setitem__(2, "object")), "unsupported dtype"),
    "a flag that is not a bool": (_with(lambda l: l["children"][0][1]["parameters"][0].__setitem__(3, 1)),
                                  "not True or False"),
    "an integer parameter that requires grad": (
        _with(lambda l: l["children"][0][1]["parameters"][0].__setitem__(2, "int64")), "not floating point"),
    "a tie to nothing earlier": (_with(lambda l: l["children"][0][1]["parameters"][1].__setitem__(4, "proj.other")),
                                 "not an earlier one like it"),
    "a tie to a tensor of another shape": (
        _with(lambda l: l["children"][0][1]["parameters"][1].__setitem__(4, "proj.weight")),
        "not an earlier one like it"),
    "a submodule shared with a later one": (_with(lambda l: l["children"].append(["again", "later"])),
                                            "not an earlier module"),
    "two entries of one name": (_with(lambda l: l["children"].append(["mask", "proj"])), "of one name"),
    "too deep": (_deep(layouts.MAX_LAYOUT_DEPTH + 1), "nest deeper than"),
    "too many numbers": (_with(lambda l: l["buffers"][0].__setitem__(1, [2**16, 2**16])), "over the limit"),
    "too many modules, as shared data": (_aliased(12), "modules or"),
    "too many tensors in one module": (
        {"parameters": [[f"w{i}", [1], "float32", True, None] for i in range(layouts.MAX_LAYOUT_TENSORS + 1)],
         "buffers": [], "children": []}, "parameters, buffers and submodules"),
}


@pytest.mark.parametrize("layout, words", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_or_oversized_layout_is_refused_before_anything_is_built(layout, words):
    assert words in (layouts.layout_problem(layout) or ""), layouts.layout_problem(layout)
    with pytest.raises(layouts.BadLayout, match="not a module layout") as info:
        layouts.build_layout(layout)
    assert words in str(info.value)


def test_the_limits_let_the_course_modules_through():
    """GPT-2 small's attention with its mask (notebook 05's visible case) is within the limits."""
    from course_utils.checks.nb05 import _attention_parameters

    layout = layouts.module_layout(_attention_parameters(768, 768, 1024))
    assert layouts.layout_problem(layout) is None


def test_a_module_argument_travels_as_its_layout_in_the_hand_in():
    from course_utils.checks.core import Case

    tied = _tied()
    encoded = probe.encode_cases([Case("tied", (tied, 3))])
    assert encoded[0]["args"] == [None, 3] and encoded[0]["module_args"] == [[0, layouts.module_layout(tied)]]
    (case,) = probe._decode_cases(encoded)
    assert case.args[1] == 3 and layouts.module_layout(case.args[0]) == layouts.module_layout(tied)
