"""The hand-off is read as untrusted data, and what each notebook's specs hand out is judged outside as the
test cell judges it in the kernel.

Each way a hand-off file or record can be bad is refused with its reason, and nothing is unpickled; then,
notebook by notebook, honest hand-offs pass, and outcomes forged in the plan's form are refused (a runner's
data no run gives) or judged as they are. Every known answer's plan and judge are held together by
``tests/checks/test_specs.py``; a right and a wrong answer per exercise cross the hand-off in
``tests/grader_answers/test_handed_out.py``.
"""

from __future__ import annotations

import os
from typing import Callable

import pytest
import torch

from course_utils.checks import ladder, layouts, probe, wire
from grader import autograde, course, intake, judge
from tests.fixtures.answers import load
from tests.support import harness

NOTEBOOKS = [n for n in course.available_notebooks() if judge.judged_exercises(n)]
NB03 = "03_trainable_self_attention"
_V1_INIT = ("class SelfAttention_v1(nn.Module):\n    def __init__(self, d_in, d_out):\n        super().__init__()\n"
            "        self.W_query = nn.Parameter(torch.rand(d_in, d_out))\n"
            "        self.W_key = nn.Parameter(torch.rand(d_in, d_out))\n"
            "        self.W_value = nn.Parameter(torch.rand(d_in, d_out))\n")
_V2_INIT = ("class SelfAttention_v2(nn.Module):\n    def __init__(self, d_in, d_out, qkv_bias=False):\n"
            "        super().__init__()\n        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
            "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n\n")

NB04 = "04_causal_attention"
#: A right CausalAttention, the base of notebook 04's edge cases.
_CA = ("class CausalAttention(nn.Module):\n"
       "    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):\n"
       "        super().__init__()\n"
       "        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
       "        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
       "        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)\n"
       "        self.dropout = nn.Dropout(dropout)\n"
       "        self.register_buffer('mask', torch.ones(context_length, context_length, dtype=torch.bool).triu(1))\n\n"
       "    def forward(self, x):\n"
       "        T = x.shape[1]\n"
       "        q, k, v = self.W_query(x), self.W_key(x), self.W_value(x)\n"
       "        s = (q @ k.transpose(1, 2)).masked_fill(self.mask[:T, :T], -torch.inf)\n"
       "        w = self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1))\n"
       "        return w @ v\n")


#: Outputs of every kind the hand-off carries, each replayed to the same verdict and message.
EDGES = {
    "changes its input in place": ("02_softmax_and_context", "softmax_stable",
                                   "def softmax_stable(x, dim=-1):\n    x -= x.max(dim=dim, keepdim=True).values\n"
                                   "    e = torch.exp(x)\n    return e / e.sum(dim=dim, keepdim=True)\n"),
    "returns a list": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n"
                       "    return (inputs @ inputs.transpose(-2, -1)).tolist()\n"),
    "returns a tuple": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n"
                        "    s = inputs @ inputs.transpose(-2, -1)\n    return s, s\n"),
    "returns None": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n"
                     "    inputs @ inputs.transpose(-2, -1)\n"),
    "returns a Python float": ("01_dot_products", "dot", "def dot(x, y):\n    total = 0.0\n"
                               "    for a, b in zip(x.tolist(), y.tolist()):\n        total += a * b\n    return total\n"),
    "returns a Parameter": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n"
                            "    return torch.nn.Parameter(inputs @ inputs.transpose(-2, -1))\n"),
    "returns an integer tensor": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n"
                                  "    return (inputs @ inputs.transpose(-2, -1)).long()\n"),
    "returns a string": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n    return 'scores'\n"),
    "returns an object": ("01_dot_products", "attention_scores", "def attention_scores(inputs):\n    return object()\n"),
    "raises its own exception": ("02_softmax_and_context", "softmax_stable",
                                 "class Oops(Exception):\n    pass\n\n"
                                 "def softmax_stable(x, dim=-1):\n    raise Oops('no idea how')\n"),
    "raises a KeyError": ("02_softmax_and_context", "softmax_naive",
                          "def softmax_naive(x, dim=-1):\n    return {}['exp']\n"),
    "raises an IndexError": ("01_dot_products", "attention_scores_for_query",
                             "def attention_scores_for_query(inputs, query):\n"
                             "    return torch.stack([inputs[i] @ query for i in range(6)])\n"),
    "not implemented": ("01_dot_products", "dot", "def dot(x, y):\n    # YOUR CODE HERE\n"
                        "    raise NotImplementedError()\n"),
    "not callable": ("01_dot_products", "dot", "dot = 3\n"),
    "batch breaks .T (a diagnosis that reads the source)": (
        "02_softmax_and_context", "context_vectors",
        "def context_vectors(inputs):\n    w = torch.softmax(inputs @ inputs.T, dim=-1)\n    return w @ inputs\n"),
    # Modules (notebook 03): what a construction and a forward pass can give.
    "a class that is not an nn.Module": (NB03, "SelfAttention_v1", "class SelfAttention_v1:\n"
                                         "    def __init__(self, d_in, d_out):\n        self.d_out = d_out\n\n"
                                         "    def __call__(self, x):\n        return x\n"),
    "a constructor that raises, under another class name": (
        NB03, "SelfAttention_v1", "class Mine(nn.Module):\n    def __init__(self, d_in, d_out):\n"
        "        super().__init__()\n        raise ValueError(f'no {d_in}')\n\nSelfAttention_v1 = Mine\n"),
    "a constructor that returns another object": (
        NB03, "SelfAttention_v2", "class SelfAttention_v2(nn.Module):\n    def __new__(cls, *args):\n"
        "        return [1, 2]\n"),
    "projections kept as plain tensors (a diagnose reads their kind)": (
        NB03, "SelfAttention_v1", "class SelfAttention_v1(nn.Module):\n    def __init__(self, d_in, d_out):\n"
        "        super().__init__()\n        self.W_query = torch.rand(d_in, d_out)\n"
        "        self.W_key = torch.rand(d_in, d_out)\n        self.W_value = torch.rand(d_in, d_out)\n\n"
        "    def forward(self, x):\n        return x @ self.W_value\n"),
    "nested layers, parameters of their own first": (
        NB03, "SelfAttention_v2", "class SelfAttention_v2(nn.Module):\n"
        "    def __init__(self, d_in, d_out, qkv_bias=False):\n        super().__init__()\n"
        "        self.scale = nn.Parameter(torch.ones(1))\n"
        "        self.proj = nn.ModuleList([nn.Linear(d_in, d_out, bias=qkv_bias) for _ in range(3)])\n\n"
        "    def forward(self, x):\n        q, k, v = (layer(x) for layer in self.proj)\n"
        "        return torch.softmax(q @ k.mT * self.scale, dim=-1) @ v\n"),
    "a forward that raises a shape error": (
        NB03, "SelfAttention_v2", _V2_INIT + "    def forward(self, x):\n"
        "        return self.W_query(x) @ self.W_key(x)\n"),
    "a module that counts its calls": (
        NB03, "SelfAttention_v1", _V1_INIT + "        self.calls = 0\n\n    def forward(self, x):\n"
        "        self.calls += 1\n        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value\n"
        "        w = torch.softmax(q @ k.transpose(-2, -1) / k.shape[-1] ** 0.5, dim=-1)\n"
        "        return w @ v * (1 if self.calls < 2 else 2)\n"),
    # A function that changes modules in place: what it leaves there, of every kind.
    "a copy that changes nothing": (NB03, "copy_v2_weights_to_v1", "def copy_v2_weights_to_v1(sa_v2, sa_v1):\n    pass\n"),
    "a copy that puts another module in place of a parameter": (
        NB03, "copy_v2_weights_to_v1", "def copy_v2_weights_to_v1(sa_v2, sa_v1):\n"
        "    del sa_v1._parameters['W_query']\n    sa_v1.W_query = nn.Identity()\n"),
    "a copy that empties a parameter": (
        NB03, "copy_v2_weights_to_v1", "def copy_v2_weights_to_v1(sa_v2, sa_v1):\n    sa_v1.W_key = None\n"),
    "a copy that replaces sa_v2's layer": (
        NB03, "copy_v2_weights_to_v1", "def copy_v2_weights_to_v1(sa_v2, sa_v1):\n"
        "    sa_v2.W_value = nn.Linear(2, 2)\n"),
    "a copy that raises": (NB03, "copy_v2_weights_to_v1", "def copy_v2_weights_to_v1(sa_v2, sa_v1):\n"
                           "    sa_v1.W_query.copy_(sa_v2.W_query.weight)\n"),
    # Modules whose checks probe them (notebook 04): what the module is made of, and its converted copies.
    "a module that keeps its mask on the CPU when moved": (
        NB04, "CausalAttention", _CA + "\n    def _apply(self, fn, recurse=True):\n        mask = self.mask\n"
        "        out = super()._apply(fn, recurse)\n        self._buffers['mask'] = mask\n        return out\n"),
    "a module that keeps a plain tensor besides its mask buffer": (
        NB04, "CausalAttention", _CA.replace("        self.dropout = nn.Dropout(dropout)\n",
                                             "        self.dropout = nn.Dropout(dropout)\n"
                                             "        self.scale = torch.tensor(float(d_out) ** -0.5)\n")),
    "a module that cannot be copied": (
        NB04, "CausalAttention", _CA + "\n    def __deepcopy__(self, memo):\n"
        "        raise RuntimeError('this module cannot be copied')\n"),
    "a device probe whose output stays on the CPU": (
        "04_causal_attention", "causal_attention_weights",
        "def causal_attention_weights(queries, keys):\n    T = queries.shape[-2]\n"
        "    if queries.device.type == 'meta':\n        return torch.zeros(T, T)\n"
        "    scores = queries @ keys.transpose(-2, -1) / keys.shape[-1] ** 0.5\n"
        "    future = torch.ones(T, T, dtype=torch.bool).triu(1)\n"
        "    return torch.softmax(scores.masked_fill(future, -torch.inf), dim=-1)\n"),
}


@pytest.mark.parametrize("notebook, exercise, source", EDGES.values(), ids=EDGES.keys())
def test_every_kind_of_output_replays_to_the_same_verdict(notebook, exercise, source, monkeypatch, capsys):
    _same_verdict_outside(notebook, exercise, source, monkeypatch, capsys)


def _inside(notebook: str, exercise: str, source: str) -> dict[str, tuple[str | None, str]]:
    """test id -> (error name or None, message): each test cell decided in this process, the old way."""
    return {gid: (None, "") if exc is None else (type(exc).__name__, str(exc))
            for gid, exc in harness.test_verdicts(notebook, exercise, str(source))}


def _handed_out(notebook: str, exercise: str, source: str, monkeypatch) -> tuple[judge.HandOff, dict]:
    """Run the answer and its test cells as the grading kernel does; return the hand-off."""
    handoff = judge.prepare(notebook)
    base, cells = harness._executed(notebook)
    namespace = dict(base)
    monkeypatch.setenv(probe.DIR_VARIABLE, handoff.outputs)
    monkeypatch.setenv(probe.INPUTS_VARIABLE, handoff.inputs)
    monkeypatch.setattr(probe, "_inputs", None)
    try:
        harness.run_source(source, namespace, f"{notebook}:{exercise}:answer")
        for gid in harness.test_ids_for(exercise, cells, notebook):
            probe.begin(gid)
            try:
                harness.run_source(cells[gid], namespace, f"{notebook}:{gid}")
            except Exception:  # noqa: BLE001 - what the kernel shows decides nothing
                pass
            finally:
                probe._end()
    finally:
        monkeypatch.delenv(probe.DIR_VARIABLE)
        monkeypatch.delenv(probe.INPUTS_VARIABLE)
        monkeypatch.setattr(probe, "_inputs", None)
    return handoff, cells


def _honest(notebook: str, exercise: str, answer: str, test: str):
    """What an honest ``answer`` hands out for its test cell: ``(records, sources)`` (a fixture's body)."""
    monkeypatch = pytest.MonkeyPatch()
    handoff, _ = _handed_out(notebook, exercise, answer, monkeypatch)
    try:
        yield judge.load_handed_out(handoff.outputs, test)[:2]
    finally:
        handoff.remove()
        monkeypatch.undo()


def _verdict_of(tmp_path, notebook: str, test: str, records, sources) -> judge.Verdict:
    """The verdict of ``test`` from ``records`` and ``sources`` written as a kernel would hand them out."""
    _write(tmp_path, {"format": probe.FORMAT, "test": test, "records": records, "sources": sources}, test)
    return judge.judge_handed_out(tmp_path, notebook, test, {})


def _copy(records: list[dict]) -> list[dict]:
    import copy

    return copy.deepcopy(records)


def _tries(records: list[dict]) -> list[list[dict]]:
    """The records of each try of ``modules.alone``, in order: an exercise that builds on the notebook's other
    exercises hands out both tries from a kernel with the reference (the first with its helpers swapped in),
    each record marked with its ``attempt``, and passes when either try passes (``modules.check_alone``). A
    forger controls every try, so a forgery that is to cost points is made in each. One list for an exercise
    with a single try."""
    marks = list(dict.fromkeys(r.get("attempt") for r in records))
    return [[r for r in records if r.get("attempt") == mark] for mark in marks]


def _same_verdict_outside(notebook, exercise, source, monkeypatch, capsys=None):
    """Each test cell's verdict, handed out as a grading kernel does and judged outside, is the one the
    test cell gives in this process."""
    want = _inside(notebook, exercise, source)
    handoff, cells = _handed_out(notebook, exercise, source, monkeypatch)
    try:
        sources = {exercise: intake.definition_of(source, exercise)[0]}
        for gid, (ename, message) in want.items():
            verdict = judge.judge_handed_out(handoff.outputs, notebook, gid, sources)
            assert (verdict.ename, verdict.evalue) == (ename, message), gid
    finally:
        handoff.remove()


def _load1(folder, test):
    return judge.load_handed_out(folder, test)[0]


def _load2(folder, test):
    return judge.load_handed_out(folder, test)[:2]


# --------------------------------------------------------------------------------------------
# The hand-off is untrusted
# --------------------------------------------------------------------------------------------
TEST = "test_dot"


def _dot_record(value=None, **changes) -> dict:
    """A plan's outcomes as a kernel hands them out: ``dot``'s first visible call, ``value`` its result,
    ``changes`` made to that outcome."""
    outcome = {"result": value if value is not None else {"kind": "tensor", "value": torch.tensor(1.0)}}
    outcome.update(changes)
    return {"exercise": "dot", "plan": "visible", "outcomes": [["book: x^1 . x^2", outcome]]}


def _path(folder, test=TEST):
    return probe.hand_off_path(folder, test)


def _write(folder, data, test=TEST):
    probe.write_hand_off(data, _path(folder, test))


def _refused(folder, words: str) -> None:
    with pytest.raises(judge.BadHandOff) as info:
        _load1(folder, TEST)
    assert words in str(info.value), str(info.value)


def test_a_well_formed_hand_off_is_read(tmp_path):
    _write(tmp_path, {"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record()]})
    assert _load1(tmp_path, TEST)[0]["exercise"] == "dot"


def test_missing_file(tmp_path):
    _refused(tmp_path, "no result came back")


def test_link_and_special_file(tmp_path):
    os.symlink("/etc/hostname", _path(tmp_path))
    _refused(tmp_path, "not a plain file")
    _path(tmp_path).unlink()
    os.mkfifo(_path(tmp_path))  # opening it would block the grader
    _refused(tmp_path, "not a plain file")


def test_oversized_file(tmp_path):
    _path(tmp_path).write_bytes(probe.HAND_OFF_MAGIC + bytes(judge.MAX_BYTES + 1))
    _refused(tmp_path, "over the limit")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this must never run",))


def test_code_in_the_hand_off_never_runs(tmp_path, capfd):
    """A pickle (what the hand-off was before format 2) is not read at all: no unpickler runs."""
    torch.save({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_RunsCode()]}, _path(tmp_path))
    _refused(tmp_path, "could not be read as plain data (it does not start with the hand-off's header")
    assert "must never run" not in capfd.readouterr().out


def test_the_writer_takes_plain_data_and_tensors_only(tmp_path):
    for value in [(1, 2), {1: "a"}, _RunsCode(), {probe.TENSOR_KEY: 1}]:
        with pytest.raises(TypeError):
            probe.write_hand_off({"value": value}, _path(tmp_path))


def _every_dtype() -> dict:
    found = {}
    for name in judge.DTYPES:
        dtype = getattr(torch, name)
        found[name] = (torch.arange(-3, 9).reshape(3, 4) % 3).to(dtype)
        found[f"{name}, no elements"] = torch.zeros(0, 5, dtype=dtype)
        found[f"{name}, 0-d"] = torch.ones((), dtype=dtype)
    found["float32, NaN and infinities"] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    found["bfloat16, NaN and infinities"] = torch.tensor([float("nan"), float("inf"), -0.0], dtype=torch.bfloat16)
    found["complex64, conjugated"] = torch.tensor([1 + 2j, -3j], dtype=torch.complex64).conj()
    found["float64, transposed"] = torch.arange(6, dtype=torch.float64).reshape(2, 3).T
    found["float32, a slice"] = torch.arange(10.0)[3:7:2]
    return found


def test_every_dtype_and_plain_value_comes_back_as_it_went_out(tmp_path):
    tensors = _every_dtype()
    numbers = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-310, 2**70, -1, True, False, None]
    texts = ["", "é ∞ \x00 \ud800 \"quoted\"", "NaN"]
    _write(tmp_path, {"tensors": tensors, "numbers": numbers, "texts": texts, "nested": [[[{}]], []]})
    back = judge.read_hand_off(_path(tmp_path).read_bytes())
    assert set(back) == {"tensors", "numbers", "texts", "nested"} and back["nested"] == [[[{}]], []]
    assert back["texts"] == texts
    assert [type(n) for n in back["numbers"]] == [type(n) for n in numbers]
    assert [str(n) for n in back["numbers"]] == [str(n) for n in numbers]  # NaN, infinities and -0.0 too
    assert list(back["tensors"]) == list(tensors)
    for name, want in tensors.items():
        got = back["tensors"][name]
        assert type(got) is torch.Tensor and got.dtype == want.dtype and got.shape == want.shape, name
        assert got.is_contiguous() and not got.is_conj() and got.untyped_storage().nbytes() == got.nbytes, name
        assert torch.equal(got.reshape(-1).view(torch.uint8), want.resolve_conj().contiguous().reshape(-1).view(torch.uint8)), name
        got.add_(1) if got.dtype != torch.bool else got.logical_not_()  # its own memory, writable


def _file_bytes(text: bytes, blob: bytes = b"", length: int | None = None) -> bytes:
    return probe.HAND_OFF_MAGIC + (len(text) if length is None else length).to_bytes(8, "little") + text + blob


def _file_of(value, blob: bytes) -> bytes:
    """A hand-off file of one record whose result is ``value``, tensors written as placeholders by hand."""
    import json

    return _file_bytes(json.dumps({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [
        _dot_record(value)]}).encode(), blob)


def _tensor_file(spec, blob=bytes(16)) -> bytes:
    return _file_of({"kind": "tensor", "value": {probe.TENSOR_KEY: spec}}, blob)


def _deep(n: int) -> bytes:
    return _file_bytes(b"[" * n + b"]" * n)


@pytest.mark.parametrize("data, words", [
    (b"", "truncated within its header"),
    (b"PK\x03\x04" + bytes(100), "does not start with the hand-off's header"),
    (probe.HAND_OFF_MAGIC[:5], "truncated within its header"),
    (probe.HAND_OFF_MAGIC + bytes(3), "truncated within its header"),
    (_file_bytes(b"{}", length=3), "runs past the end of the file"),
    (_file_bytes(b"{}", length=2**64 - 1), "runs past the end of the file"),
    (_file_bytes(b'{"format": 2, "test": '), "Expecting value"),
    (_file_bytes(b'{"a": 1, "a": 2}'), "a key appears twice"),
    (_file_bytes(b"\xff\xfe{}"), "utf-8"),
    (_deep(100_000), "nests too deep"),
    (_tensor_file(["float8_e4m3fn", [2], 0, 2]), "unsupported dtype 'float8_e4m3fn'"),
    (_tensor_file(["object", [2], 0, 2]), "unsupported dtype"),
    (_tensor_file(["float32", [2], 0, 7]), "takes 8 bytes, not 7"),
    (_tensor_file(["float32", [3], 0, 8]), "takes 12 bytes, not 8"),
    (_tensor_file(["float32", [4], 4, 16]), "bytes are outside the file"),
    (_tensor_file(["float32", [1], -4, 4]), "bytes are outside the file"),
    (_tensor_file(["float32", [4], 0, 16], blob=bytes(8)), "bytes are outside the file"),
    (_tensor_file(["float32", [-1, -4], 0, 16]), "shape is not a short list of sizes"),
    (_tensor_file(["float32", [2.0], 0, 8]), "shape is not a short list of sizes"),
    (_tensor_file(["float32", [1] * 9, 0, 4]), "shape is not a short list of sizes"),
    (_tensor_file(["float32", [2], True, 8]), "bytes are outside the file"),
    (_tensor_file(["float32", [2], 0]), "not [dtype, shape, offset, nbytes]"),
    (_tensor_file(["bool", [2], 0, 2], blob=b"\x01\x07"), "other than 0 and 1"),
])
def test_a_malformed_hand_off_file_is_refused(tmp_path, data, words):
    _path(tmp_path).write_bytes(data)
    _refused(tmp_path, "could not be read as plain data")
    _refused(tmp_path, words)


def test_deep_but_readable_nesting_is_refused_by_the_layout_check(tmp_path):
    value = {"kind": "none"}
    for _ in range(200):
        value = {"kind": "list", "items": [value]}
    _path(tmp_path).write_bytes(_file_of(value, b""))
    _refused(tmp_path, "too long, too deep or malformed")


def test_tensors_cannot_share_bytes_to_take_more_memory_than_the_file(tmp_path):
    value = {"kind": "list", "items": [{"kind": "tensor", "value": {probe.TENSOR_KEY: ["float32", [4], 0, 16]}}] * 2}
    _path(tmp_path).write_bytes(_file_of(value, bytes(16)))
    _refused(tmp_path, "more tensor bytes than the file holds")
    value["items"] = value["items"][:1]  # one is fine
    _path(tmp_path).write_bytes(_file_of(value, bytes(16)))
    assert torch.equal(_load1(tmp_path, TEST)[0]["outcomes"][0][1]["result"]["items"][0]["value"], torch.zeros(4))


@pytest.mark.parametrize("data, words", [
    ({"passed": True}, "does not have the hand-off's layout"),
    ({"format": 99, "test": TEST, "sources": {}, "records": []}, "not this test's"),
    ({"format": probe.FORMAT, "test": "test_other", "sources": {}, "records": []}, "not this test's"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": "all good"}, "not a list"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record(verdict="pass")]}, "expected a result or an error"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record({"kind": "tensor", "value": [1.0, 2.0]})]},
     "not a plain torch.Tensor"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record({"kind": "tensor",
                                                                 "value": torch.zeros(judge.MAX_ELEMENTS + 1, dtype=torch.uint8)})]},
     "over the limit"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record({"kind": "number", "type": "int", "value": 1.5})]},
     "a number whose type"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [_dot_record({"kind": "other", "type": "not a name"})]},
     "without a type name"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [{"exercise": "dot", "plan": "visible", "outcomes": [
        ["book: x^1 . x^2", {"error": {"type": "ValueError"}}]]}]}, "an error without"),
    ({"format": probe.FORMAT, "test": TEST, "sources": {}, "records": [{"exercise": "dot", "inputs": {}, "result": {}}]},
     "not the outcomes of a plan"),
])
def test_malformed_or_mistyped_records(tmp_path, data, words):
    _write(tmp_path, data)
    _refused(tmp_path, words)


def test_sources_must_be_short_texts_by_exercise(tmp_path):
    _write(tmp_path, {"format": probe.FORMAT, "test": TEST, "records": [], "sources": {"dot": 3}})
    _refused(tmp_path, "sources handed out")


def test_rules_read_the_function_the_kernel_checked(monkeypatch, capsys):
    """A clean answer cell, and the function redefined with a forbidden call in a later cell: the rule
    applies to the function that was checked, as it did when the kernel decided."""
    clean = "def softmax_stable(x, dim=-1):\n    e = torch.exp(x - x.max(dim=dim, keepdim=True).values)\n" \
            "    return e / e.sum(dim=dim, keepdim=True)\n"
    sneaky = "def softmax_stable(x, dim=-1):\n    return torch.softmax(x, dim=dim)\n"
    want = _inside("02_softmax_and_context", "softmax_stable", clean + "\n" + sneaky)
    handoff, _ = _handed_out("02_softmax_and_context", "softmax_stable", clean + "\n" + sneaky, monkeypatch)
    try:
        verdict = judge.judge_handed_out(handoff.outputs, "02_softmax_and_context", "test_softmax_stable",
                                         {"softmax_stable": clean})
    finally:
        handoff.remove()
    assert (verdict.ename, verdict.evalue) == want["test_softmax_stable"]
    assert "torch.softmax" in verdict.evalue and "does not allow" in verdict.evalue


def test_an_error_comes_back_as_what_the_student_code_raised():
    error = wire.error_of("IndexError", "index 6 is out of bounds")
    assert isinstance(error, IndexError) and type(error).__name__ == "IndexError"
    assert str(error) == "index 6 is out of bounds"
    odd = wire.error_of("SystemExit", "bye")  # never an escape from the check engine
    assert isinstance(odd, Exception) and type(odd).__name__ == "SystemExit"
    mine = wire.error_of("MyOwnError", "boom")
    assert isinstance(mine, Exception) and type(mine).__name__ == "MyOwnError"


# --------------------------------------------------------------------------------------------
# Modules and in-place changes (notebook 03): the new records are untrusted too
# --------------------------------------------------------------------------------------------
_RIGHT_V1 = _V1_INIT + ("\n    def forward(self, x):\n        q, k, v = x @ self.W_query, x @ self.W_key, x @ self.W_value\n"
                        "        return torch.softmax(q @ k.mT / k.shape[-1] ** 0.5, dim=-1) @ v\n")
V1_TEST = "test_SelfAttention_v1"


# --------------------------------------------------------------------------------------------
# A function of a module (notebook 05's count_parameters): modules travel as layouts
# --------------------------------------------------------------------------------------------
NB05 = "05_multi_head_attention"
COUNT_TEST = "test_count_parameters"
_COUNT = "def count_parameters(module):\n    return sum(p.numel() for p in module.parameters() if p.requires_grad)\n"


@pytest.fixture(scope="module")
def honest_count():
    """What an honest count_parameters hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB05, "count_parameters", _COUNT, COUNT_TEST)


def _count_verdict(tmp_path, records, sources) -> judge.Verdict:
    return _verdict_of(tmp_path, NB05, COUNT_TEST, records, sources)


def test_hidden_modules_reach_the_kernel_as_layouts(monkeypatch):
    """count_parameters' hidden modules (the reference's classes among them) go into the inputs file as
    plain layouts, in the plan the grader sends in, and the kernel rebuilds modules of the same make-up."""
    from course_utils.checks import expected

    handoff = judge.prepare(NB05)
    try:
        data = torch.load(handoff.inputs, weights_only=True)  # plain data: no module, no class
        assert set(data) == {"format", "plans"}  # its hidden cases travel in its plan only
        encoded = [s["case"] for s in data["plans"]["count_parameters"]["hidden"]]
        assert all(c["args"] == [None] and [i for i, _ in c["module_args"]] == [0] for c in encoded)
        monkeypatch.setenv(probe.DIR_VARIABLE, handoff.outputs)
        monkeypatch.setenv(probe.INPUTS_VARIABLE, handoff.inputs)
        monkeypatch.setattr(probe, "_inputs", None)
        got = [case for _, case, _ in probe.plan("count_parameters", True)][3:]  # after the 3 visible cases
        want = expected.instructor().hidden("count_parameters")
        assert [c.name for c in got] == [c.name for c in want]
        for mine, theirs in zip(got, want):
            assert layouts.module_layout(mine.args[0]) == layouts.module_layout(theirs.args[0])
            assert type(mine.args[0]) is torch.nn.Module
    finally:
        handoff.remove()
        monkeypatch.setattr(probe, "_inputs", None)


def _outcomes(record: dict) -> dict:
    """A spec's record (``{"exercise", "plan", "outcomes"}``): key -> outcome, as handed out."""
    return dict(record["outcomes"])


def _value(record: dict, key: str):
    """What the step ``key`` of a spec's record gave, decoded."""
    from course_utils.checks import wire

    return wire.decode(_outcomes(record)[key]["result"])


def _set_value(record: dict, key: str, value) -> None:
    """Forge what the step ``key`` of a spec's record gave."""
    from course_utils.checks import wire

    for item in record["outcomes"]:
        if item[0] == key:
            item[1] = {"result": wire.encode(value)}


def test_an_honest_count_hand_off_passes(tmp_path, honest_count):
    records, sources = honest_count
    assert [(r["plan"], len(r["outcomes"])) for r in records] == [("visible", 3), ("hidden", 8)]
    hidden = [outcome["result"] for _, outcome in records[1]["outcomes"]]
    assert hidden[3:5] == [{"kind": "number", "type": "int", "value": 96}, {"kind": "number", "type": "int", "value": 25}]
    verdict = _count_verdict(tmp_path, records, sources)
    assert verdict.ename is None and "✅ count_parameters: 8 cases agree" in verdict.text, verdict.evalue


_COUNT_WRONG = load(NB05).WRONG["count_parameters"]


@pytest.mark.parametrize("label", list(_COUNT_WRONG))
def test_a_wrong_count_judged_outside_loses_its_points_with_its_message(label, monkeypatch):
    answer = _COUNT_WRONG[label]
    handoff, _ = _handed_out(NB05, "count_parameters", answer, monkeypatch)
    try:
        verdict = judge.judge_handed_out(handoff.outputs, NB05, COUNT_TEST, {})
    finally:
        handoff.remove()
    assert verdict.ename == "CheckFailed" and answer.hint in verdict.evalue, verdict.evalue


def _rename(record: dict, index: int, key: str) -> None:
    record["outcomes"][index][0] = key


@pytest.mark.parametrize("forge, words", [
    (lambda rs: _rename(rs[1], 3, "a module of my own"), "not those of the calls the grader asked for"),
    (lambda rs: rs[1]["outcomes"].pop(), "not those of the calls the grader asked for"),
    (lambda rs: rs[0]["outcomes"].append(["nn.Linear(3, 2) again", rs[0]["outcomes"][1][1]]),
     "not those of the calls the grader asked for"),
    (lambda rs: rs.pop(), "no outcomes came back for the hidden check"),
    (lambda rs: rs.reverse(), "outcomes of another plan"),
])
def test_a_count_of_another_module_or_a_missing_one_scores_zero(tmp_path, honest_count, forge, words):
    """The outcomes are looked up by the keys of the plan the grader sent in: one of another key, one
    missing, one too many or a record of the other plan is a hand-off that was changed."""
    records, sources = honest_count
    forged = _copy(records)
    forge(forged)
    verdict = _count_verdict(tmp_path, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and words in verdict.evalue, verdict.evalue


def test_a_mistyped_count_record_scores_zero_with_a_reason(tmp_path, honest_count):
    records, sources = honest_count
    text = _copy(records)
    _set_value(text[0], text[0]["outcomes"][0][0], "2,360,064")
    verdict = _count_verdict(tmp_path, text, sources)
    assert verdict.ename == "CheckFailed" and "expected a number, got str" in verdict.evalue, verdict.evalue
    for forge, words in [
        (lambda r: r["outcomes"][0][1].__setitem__("extra", 1), "expected a result or an error"),
        (lambda r: r["outcomes"][0][1].__setitem__("changed", "0"), "changed is not a list"),
        (lambda r: r["outcomes"].__setitem__(0, r["outcomes"][0][:1]), "not [a key of its own, the outcome]"),
        (lambda r: r.__setitem__("plan", "mine"), "without the plan's name"),
    ]:
        forged = _copy(records)
        forge(forged[0])
        with pytest.raises(judge.BadHandOff) as info:
            _count_verdict(tmp_path, forged, sources)
        assert words in str(info.value), str(info.value)


# --------------------------------------------------------------------------------------------
# Modules whose checks probe them (notebook 04): forward passes looked up, make-up handed out
# --------------------------------------------------------------------------------------------
CA_TEST = "test_CausalAttention"


@pytest.fixture(scope="module")
def honest_ca():
    """What an honest CausalAttention hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB04, "CausalAttention", _CA, CA_TEST)


def _ca_verdict(tmp_path, records, sources) -> judge.Verdict:
    return _verdict_of(tmp_path, NB04, CA_TEST, records, sources)


#: The step of the first construction of CausalAttention's check (dropout 0.5): the one every check reads.
_CA_FIRST = "module (3, 2, 6, 0.5)"


def _probed_plan(exercise: str, record: dict) -> list:
    """The plan the grader sent in for ``record`` (visible or hidden): its steps list each pass in order."""
    from course_utils import checks
    from course_utils.checks import expected

    with expected.using(expected.LIVE):
        return checks.SPECS[exercise].steps(record["plan"] == "hidden")


def _forge_module(records: list[dict], key: str, change) -> None:
    """``change(outcome)`` on what the probed step ``key`` gave, in every record (every try: either passing
    passes, ``modules.alone``), written back as the kernel would write it."""
    for record in records:
        if key in _outcomes(record):
            found = _value(record, key)
            change(found)
            _set_value(record, key, found)


def _pass_index(exercise: str, record: dict, key: str, mode: str, seed, copy=None) -> list[int]:
    """Where the passes ``(mode, seed, copy)`` are among the passes of the probed step ``key``."""
    step = next(s for s in _probed_plan(exercise, record) if s.key == key)
    return [i for i, (m, sd, c, _, _) in enumerate(step.case.args[0]) if (m, sd, c) == (mode, seed, copy)]


def test_an_honest_probed_module_hand_off_passes(tmp_path, honest_ca):
    records, sources = honest_ca
    assert [(r["plan"], r["attempt"]) for r in records] == [("visible", 1), ("visible", 2), ("hidden", 1), ("hidden", 2)]
    first = _value(records[0], _CA_FIRST)
    assert first["built"]["structure"] == {"buffers": [["mask", [6, 6], "bool", True]], "plain": []}
    assert first["built"]["meta_left"] == []
    passes = next(s for s in _probed_plan("CausalAttention", records[0]) if s.key == _CA_FIRST).case.args[0]
    assert {c for _, _, c, _, _ in passes} == {None, "float64", "meta"} and {s for _, s, _, _, _ in passes} >= {None, 1, 2, 7}
    assert len(first["passes"]) == len(passes)
    meta = first["passes"][[c for _, _, c, _, _ in passes].index("meta")]
    assert meta["value"].device.type == "meta"
    verdict = _ca_verdict(tmp_path, records, sources)
    assert verdict.ename is None and "no position sees the future" in verdict.text, verdict.evalue


@pytest.mark.parametrize("forge", [
    lambda o: o["built"]["structure"].__setitem__("buffers", [["mask", [6, 6], "bool", "yes"]]),
    lambda o: o["built"]["structure"].__setitem__("buffers", [["mask", "6 by 6", "bool", True]]),
    lambda o: o["built"]["structure"].__setitem__("plain", [[3, [6, 6], "bool"]]),
    lambda o: o["built"]["structure"].__setitem__("verdict", "pass"),
    lambda o: o["built"].__setitem__("meta_left", [["mask", 0]]),
    lambda o: o["built"].__setitem__("copy_error", {"type": "RuntimeError", "message": ""}),
    lambda o: o["built"].__setitem__("shapes", [[2, -3]]),
    lambda o: o["built"].pop("name"),
    lambda o: o.__setitem__("verdict", "pass"),
    lambda o: o["passes"][0].__setitem__("verdict", "pass"),
    lambda o: o["passes"].append({"value": 1}),
    lambda o: o["passes"].__setitem__(0, {"value": 1, "error": ["ValueError", "x"]}),
], ids=["a flag that is not True or False", "a shape that is not sizes", "a name that is not text", "more fields",
        "what .to('meta') left", "a copy's error", "a negative size", "no class name", "a verdict of its own",
        "a pass with more fields", "a pass the plan does not make", "a pass with a value and an error"])
def test_a_forged_probed_construction_scores_zero(tmp_path, honest_ca, forge):
    """What a probed construction gave is read only in the form ``spec.run_module`` gives it: a make-up or
    passes of another form are a hand-off that was changed (``spec.refuse``), worth 0 with the reason."""
    records, sources = honest_ca
    forged = _copy(records)
    _forge_module(forged, _CA_FIRST, forge)
    verdict = _ca_verdict(tmp_path, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "probed construction" in verdict.evalue, verdict.evalue


def test_a_missing_probe_scores_zero_and_a_forged_one_earns_nothing(tmp_path, honest_ca):
    records, sources = honest_ca
    # A forward pass the check makes that did not come back (the meta copy's, the last): 0, saying why.
    short = _copy(records)
    _forge_module(short, _CA_FIRST, lambda o: o["passes"].pop())
    verdict = _ca_verdict(tmp_path, short, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "fewer than the plan's" in verdict.evalue, verdict.evalue
    # Dropout's passes under seeds 1 and 2 forged equal: the train() check fails, as it would live.
    forged = _copy(records)
    for record in forged:
        one, two = (_pass_index("CausalAttention", record, _CA_FIRST, "train", seed)[0] for seed in (1, 2))
        _forge_module([record], _CA_FIRST, lambda o: o["passes"].__setitem__(two, o["passes"][one]))
    verdict = _ca_verdict(tmp_path, forged, sources)
    assert verdict.ename == "CheckFailed" and "no dropout in train() mode" in verdict.evalue, verdict.evalue
    # A construction the check asks for that did not come back.
    gone = _copy(records)
    for record in gone:
        record["outcomes"] = [item for item in record["outcomes"] if item[0] != "module (5, 4, 10, 0.3, True)"]
    verdict = _ca_verdict(tmp_path, gone, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue


def test_what_the_meta_copy_left_is_read(tmp_path, honest_ca):
    """The kernel says the mask stayed on the CPU after .to('meta'): the check outside says so."""
    records, sources = honest_ca
    forged = _copy(records)
    _forge_module(forged, _CA_FIRST, lambda o: o["built"].__setitem__("meta_left", [["mask", "cpu"]]))
    verdict = _ca_verdict(tmp_path, forged, sources)
    assert verdict.ename == "CheckFailed" and "stayed behind: ['mask (cpu)']" in verdict.evalue, verdict.evalue


def test_hidden_groups_of_cases_reach_the_kernel_in_the_plan(monkeypatch):
    """CausalAttention's hidden cases are named groups (configs, and causal cases with their own
    construction): they travel only as the hidden plan's steps, one per construction, each with its passes,
    and come back out of the inputs file in the kernel as they went."""
    from course_utils.checks import expected

    want = _probed_plan("CausalAttention", {"plan": "hidden"})
    hidden = expected.instructor().hidden("CausalAttention")
    handoff = judge.prepare(NB04)
    try:
        data = torch.load(handoff.inputs, weights_only=True)
        assert set(data) == {"format", "plans"}
        monkeypatch.setenv(probe.DIR_VARIABLE, handoff.outputs)
        monkeypatch.setenv(probe.INPUTS_VARIABLE, handoff.inputs)
        monkeypatch.setattr(probe, "_inputs", None)
        got = probe.plan("CausalAttention", True)
        builds = {b for b, _ in hidden["configs"]} | {c.build for c in hidden["causal"]}
        assert builds <= {case.build for _, case, _ in got}
        assert [(k, case.build, r) for k, case, r in got] == [(s.key, s.case.build, s.run) for s in want]
        for (_, case, _), step in zip(got, want):
            mine, theirs = case.args[0], step.case.args[0]
            assert [p[:3] for p in mine] == [p[:3] for p in theirs]
            assert all(a[3].shape == b[3].shape and (a[3].device.type == "meta" or torch.equal(a[3], b[3]))
                       for a, b in zip(mine, theirs))
    finally:
        handoff.remove()
        monkeypatch.setattr(probe, "_inputs", None)


# --------------------------------------------------------------------------------------------
# Notebook 06: its module classes judged outside; the calls of the fused kernel counted in the kernel
# --------------------------------------------------------------------------------------------
NB06 = "06_efficient_attention_gpu"
COMBINED_TEST, SDPA_TEST = "test_MultiHeadAttentionCombinedQKV", "test_MHAPyTorchSDPA"
_NB06 = load(NB06)
_SDPA_RIGHT = _NB06._sdpa(_NB06._SDPA_FORWARD)
#: Right outputs, with F.scaled_dot_product_attention called a second time (its result unused).
_SDPA_TWICE = _NB06._sdpa(_NB06._SDPA_FORWARD.replace(
    "        return self.out_proj(", "        F.scaled_dot_product_attention(q, k, v, is_causal=True)\n"
                                    "        return self.out_proj("))


def test_a_second_sdpa_call_is_counted_outside_as_in_the_kernel(monkeypatch, capsys):
    """The check counts the calls of the fused kernel: the kernel hands the count out with each forward
    pass, and the replay outside gives the check the same count, so the verdict is the kernel's."""
    want = _inside(NB06, "MHAPyTorchSDPA", _SDPA_TWICE)
    assert "called F.scaled_dot_product_attention 2 times" in want[SDPA_TEST][1], want
    _same_verdict_outside(NB06, "MHAPyTorchSDPA", _SDPA_TWICE, monkeypatch, capsys)


@pytest.fixture(scope="module")
def honest_sdpa():
    """What an honest MHAPyTorchSDPA hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB06, "MHAPyTorchSDPA", _SDPA_RIGHT, SDPA_TEST)


def _sdpa_verdict(tmp_path, records, sources) -> judge.Verdict:
    return _verdict_of(tmp_path, NB06, SDPA_TEST, records, sources)


def _module_keys(record: dict) -> list[str]:
    return [key for key, _ in record["outcomes"] if key.startswith("module ")]


def _forge_every_pass(records: list[dict], change) -> None:
    """``change(pass)`` on every pass of every probed construction of every record."""
    for record in records:
        for key in _module_keys(record):
            _forge_module([record], key, lambda o: [change(one) for one in o["passes"]])


def test_an_honest_sdpa_hand_off_counts_one_call_per_pass(tmp_path, honest_sdpa):
    records, sources = honest_sdpa
    passes = [one for r in records for key in _module_keys(r) for one in _value(r, key)["passes"]]
    assert passes and all(one["calls"] == {"scaled_dot_product_attention": 1} for one in passes)
    verdict = _sdpa_verdict(tmp_path, records, sources)
    assert verdict.ename is None and "one SDPA call" in verdict.text, verdict.evalue


@pytest.mark.parametrize("calls", [
    {"scaled_dot_product_attention": -1}, {"scaled_dot_product_attention": 1.0},
    {"scaled_dot_product_attention": True}, {"scaled_dot_product_attention": "1"},
    {"scaled_dot_product_attention": probe.MAX_CALLS + 1}, {"softmax": 1}, [1], 1,
])
def test_a_malformed_count_of_calls_scores_zero(tmp_path, honest_sdpa, calls):
    records, sources = honest_sdpa
    records = _copy(records)
    _forge_every_pass(records, lambda one: one.__setitem__("calls", calls))
    verdict = _sdpa_verdict(tmp_path, records, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "count of calls" in verdict.evalue, verdict.evalue


def test_the_count_of_calls_is_read_from_the_hand_off(tmp_path, honest_sdpa):
    """A count of 2 fails as the kernel's own would; a count left out is a hand-off that was changed
    (``spec.run_module`` counts the calls of every pass), and earns nothing."""
    records, sources = honest_sdpa
    twice = _copy(records)
    _forge_every_pass(twice, lambda one: one.__setitem__("calls", {"scaled_dot_product_attention": 2}))
    verdict = _sdpa_verdict(tmp_path, twice, sources)
    assert verdict.ename == "CheckFailed" and "2 times" in verdict.evalue, verdict.evalue
    gone = _copy(records)
    _forge_every_pass(gone, lambda one: one.pop("calls"))
    verdict = _sdpa_verdict(tmp_path, gone, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "count of calls" in verdict.evalue, verdict.evalue


@pytest.fixture(scope="module")
def honest_combined():
    """What an honest MultiHeadAttentionCombinedQKV hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB06, "MultiHeadAttentionCombinedQKV", _NB06._combined(_NB06._COMBINED_FORWARD), COMBINED_TEST)


def test_a_combined_qkv_hand_off_is_judged_outside(tmp_path, honest_combined):
    records, sources = honest_combined
    verdict = _verdict_of(tmp_path, NB06, COMBINED_TEST, records, sources)
    assert verdict.ename is None and "no position sees the future" in verdict.text, verdict.evalue
    # The float64 copy's pass, which the check makes, did not come back: 0, saying why.
    first = "module (4, 6, 8, 0.5, 2)"
    missing = _copy(records)
    for record in missing:
        cut = _pass_index("MultiHeadAttentionCombinedQKV", record, first, "eval", 7, "float64")[0]
        _forge_module([record], first, lambda o: o["passes"].__delitem__(slice(cut, None)))
    verdict = _verdict_of(tmp_path, NB06, COMBINED_TEST, missing, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "fewer than the plan's" in verdict.evalue, verdict.evalue
    # The mask buffer handed out as gone: the buffer check fails, as it would on such a module.
    forged = _copy(records)
    for record in forged:
        for key in _module_keys(record):
            _forge_module([record], key, lambda o: o["built"]["structure"].__setitem__("buffers", []))
    verdict = _verdict_of(tmp_path, NB06, COMBINED_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "no buffer of shape" in verdict.evalue, verdict.evalue


# The timer (notebook 06): what each simulated device saw comes back, and the verdict is computed outside.
TIMER_TEST = "test_time_cuda_aware"
_TIMER_RIGHT = _NB06._TIMER


@pytest.mark.parametrize("source", [
    "import numpy as np\n" + _TIMER_RIGHT.replace("statistics.median(times)", "np.median(times)"),
    _TIMER_RIGHT.replace("return statistics.median(times)", "return torch.tensor(times).median()"),
    _TIMER_RIGHT.replace("return statistics.median(times)", "return str(statistics.median(times))"),
    _TIMER_RIGHT.replace("    for _ in range(warmup):\n        fn()\n", "    for _ in range(warmup):\n        fn(1)\n"),
], ids=["numpy's float64", "a 0-dim tensor", "a string", "calls fn with an argument"])
def test_every_kind_of_timer_outcome_replays_to_the_same_verdict(source, monkeypatch, capsys):
    _same_verdict_outside(NB06, "time_cuda_aware", source, monkeypatch, capsys)


@pytest.fixture(scope="module")
def honest_timer():
    """What an honest time_cuda_aware hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB06, "time_cuda_aware", _TIMER_RIGHT, TIMER_TEST)


def _timer_verdict(tmp_path, records, sources) -> judge.Verdict:
    return _verdict_of(tmp_path, NB06, TIMER_TEST, records, sources)


def _first_timer(record: dict) -> str:
    return record["outcomes"][0][0]


def test_an_honest_timer_hand_off_passes(tmp_path, honest_timer):
    records, sources = honest_timer
    assert [(r["plan"], len(r["outcomes"])) for r in records] == [("visible", 3), ("hidden", 7)]
    first = _value(records[0], _first_timer(records[0]))
    assert isinstance(first, tuple) and isinstance(first[0], float) and first[1:] == (8, 10, 10)
    verdict = _timer_verdict(tmp_path, records, sources)
    assert verdict.ename is None and "simulated devices timed right" in verdict.text, verdict.evalue


@pytest.mark.parametrize("item, value", [(1, 8.0), (2, -1), (3, "10"), (3, None), (1, True)])
def test_a_malformed_timer_outcome_scores_zero(tmp_path, honest_timer, item, value):
    records, sources = honest_timer
    forged = _copy(records)
    key = _first_timer(forged[0])
    found = list(_value(forged[0], key))
    if value is None:
        found.pop(item)
    else:
        found[item] = value
    _set_value(forged[0], key, tuple(found))
    verdict = _timer_verdict(tmp_path, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "simulated device" in verdict.evalue, verdict.evalue


def test_a_timer_outcome_is_judged_outside(tmp_path, honest_timer):
    """Counts and results are read from the hand-off and judged as the kernel's own would be; one device's
    outcome handed out as another's earns nothing, and a check whose outcomes did not come back scores 0."""
    records, sources = honest_timer
    key = _first_timer(records[0])

    def forged(change) -> list[dict]:
        found = _copy(records)
        value = list(_value(found[0], key))
        change(value)
        _set_value(found[0], key, tuple(value))
        return found

    verdict = _timer_verdict(tmp_path, forged(lambda v: v.__setitem__(1, 5)), sources)  # fn called 5 times
    assert verdict.ename == "CheckFailed" and "warm-up calls are missing" in verdict.evalue, verdict.evalue
    verdict = _timer_verdict(tmp_path, forged(lambda v: v.__setitem__(0, v[0] * 2)), sources)
    assert verdict.ename == "CheckFailed" and "expected 0.011 s" in verdict.evalue, verdict.evalue
    swapped = _copy(records)
    (one, a), (two, b) = swapped[0]["outcomes"][:2]
    swapped[0]["outcomes"][:2] = [[one, b], [two, a]]
    verdict = _timer_verdict(tmp_path, swapped, sources)
    assert verdict.ename == "CheckFailed" and "simulated GPU, warmup=3" in verdict.evalue, verdict.evalue
    verdict = _timer_verdict(tmp_path, _copy(records)[:1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue


# --------------------------------------------------------------------------------------------
# Notebook 08: its functions are specs; sliding_window_mask_mod's masks are steps of sliding_window_mask's plan
# --------------------------------------------------------------------------------------------
NB08 = "08_kv_cache_gqa_and_windows"
_NB08 = load(NB08)
WINDOW_TEST, DECODE_TEST = "test_sliding_window_mask", "test_decode_causal_mask"


def _outcomes_of(records: list[dict], exercise: str, plan: str = "visible") -> list[dict]:
    """The outcomes (``[key, outcome]`` pairs, by reference) of each of ``exercise``'s records of ``plan`` (one per
    try of ``modules.alone``): what a spec's check hands out (``spec.Spec.hand_out``)."""
    return [r["outcomes"] for r in records if r["exercise"] == exercise and r.get("plan") == plan]


def _forge_outcome(records: list[dict], exercise: str, keyed: Callable[[str], bool], change: Callable[[dict], None],
                   plan: str = "visible") -> list[dict]:
    """A copy of ``records`` with ``change(outcome)`` made to the first outcome whose key ``keyed`` picks, in each
    try's record of ``plan``."""
    forged = _copy(records)
    for outcomes in _outcomes_of(forged, exercise, plan):
        change(next(o for k, o in outcomes if keyed(k)))
    return forged


def _drop_outcome(records: list[dict], exercise: str, keyed: Callable[[str], bool]) -> list[dict]:
    """A copy of ``records`` without the outcomes whose keys ``keyed`` picks (every plan, every try)."""
    forged = _copy(records)
    for record in forged:
        if record["exercise"] == exercise:
            record["outcomes"] = [[k, o] for k, o in record["outcomes"] if not keyed(k)]
    return forged


def _is_mod(key: str) -> bool:
    from course_utils.checks import nb08

    return key.startswith(nb08.MOD_STEP)


def _must_raise(key: str) -> bool:
    from course_utils.checks import nb08

    return key.startswith(nb08.MUST_RAISE)


@pytest.fixture(scope="module")
def honest_window():
    """What an honest sliding_window_mask (and its mask_mod) hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB08, "sliding_window_mask", _NB08._WINDOW, WINDOW_TEST)


@pytest.fixture(scope="module")
def honest_decode():
    """What an honest decode_causal_mask hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB08, "decode_causal_mask", _NB08._DECODE, DECODE_TEST)


def _window_sources(sources: dict) -> dict:
    """The answer cell's two functions, as the grader reads them from the submission (``judge.answer_sources``)."""
    return {**sources, "sliding_window_mask_mod": intake.definition_of(_NB08._WINDOW, "sliding_window_mask_mod")[0]}


def test_an_honest_window_hand_off_passes(tmp_path, honest_window):
    """The companion's masks are outcomes of sliding_window_mask's own plan: nothing goes out under its name."""
    records, sources = honest_window
    assert {r["exercise"] for r in records} == {"sliding_window_mask"}
    mods = [o for outcomes in _outcomes_of(records, "sliding_window_mask") for k, o in outcomes if _is_mod(k)]
    assert mods and all([i["kind"] for i in o["result"]["items"]] == ["text", "tensor", "text"] for o in mods)
    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, records, _window_sources(sources))
    assert verdict.ename is None and "the mask_mod keeps exactly the other entries" in verdict.text, verdict.evalue


@pytest.mark.parametrize("forge", ["a mask of another shape", "an unknown outcome", "a number", "too few items"])
def test_a_malformed_mask_mod_outcome_scores_zero(tmp_path, honest_window, forge):
    records, sources = honest_window

    def change(outcome: dict) -> None:
        items = outcome["result"]["items"]
        if forge == "a mask of another shape":
            items[1]["value"] = torch.zeros(3, 3, dtype=torch.bool)
        elif forge == "an unknown outcome":
            items[0]["value"] = "verdict"
        elif forge == "a number":
            outcome["result"] = {"kind": "number", "type": "bool", "value": True}
        else:
            items.pop()

    forged = _forge_outcome(records, "sliding_window_mask", _is_mod, change)
    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, forged, _window_sources(sources))
    assert verdict.ename == judge.HANDOFF_ERROR and "what came back from sliding_window_mask_mod" in verdict.evalue, \
        verdict.evalue


def test_a_mask_mod_outcome_is_judged_outside(tmp_path, honest_window):
    """A forged mask earns nothing; a missing outcome scores 0; one that says the kernel's mask_mod could not be
    called fails as the check would on what the kernel was given."""
    records, sources = honest_window
    sources = _window_sources(sources)

    def flip(outcome: dict) -> None:
        mask = outcome["result"]["items"][1]
        mask["value"] = ~mask["value"]

    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, _forge_outcome(records, "sliding_window_mask", _is_mod, flip),
                          sources)
    assert verdict.ename == "CheckFailed" and "MAY attend" in verdict.evalue, verdict.evalue
    gone = _drop_outcome(records, "sliding_window_mask", _is_mod)
    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, gone, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue
    none = _copy(records)
    for record in none:
        record["outcomes"] = [[k, {"result": wire.encode(["absent", "NoneType"])} if _is_mod(k) else o]
                              for k, o in record["outcomes"]]
    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, none, sources)
    assert verdict.ename == "CheckFailed" and "got NoneType" in verdict.evalue, verdict.evalue
    some = _forge_outcome(records, "sliding_window_mask", _is_mod,
                          lambda o: o.update(result=wire.encode(["absent", "NoneType"])))
    verdict = _verdict_of(tmp_path, NB08, WINDOW_TEST, some, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "absent for some cases only" in verdict.evalue, verdict.evalue


def test_the_calls_that_must_raise_are_judged_outside(tmp_path, honest_decode):
    """decode_causal_mask's calls with more queries than keys are steps of its plan, and its dtype check reads the
    compared calls' outcomes: one left out scores 0, one forged into a mask fails as the kernel's own check would."""
    records, sources = honest_decode
    raising = [o for k, o in _outcomes_of(records, "decode_causal_mask")[0] if _must_raise(k)]
    assert [o.get("error", {}).get("type") for o in raising] == ["ValueError", "ValueError"]
    verdict = _verdict_of(tmp_path, NB08, DECODE_TEST, records, sources)
    assert verdict.ename is None and "num_queries > num_keys raises" in verdict.text, verdict.evalue
    verdict = _verdict_of(tmp_path, NB08, DECODE_TEST, _drop_outcome(records, "decode_causal_mask", _must_raise),
                          sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue

    def returned(outcome: dict) -> None:
        outcome.pop("error")
        outcome["result"] = wire.encode(torch.zeros(5, 3, dtype=torch.bool))

    verdict = _verdict_of(tmp_path, NB08, DECODE_TEST, _forge_outcome(records, "decode_causal_mask", _must_raise,
                                                                       returned), sources)
    assert verdict.ename == "CheckFailed" and "Raise a ValueError" in verdict.evalue, verdict.evalue
    floats = _forge_outcome(records, "decode_causal_mask", lambda k: not _must_raise(k),
                            lambda o: o.update(result=wire.encode(wire.decode(o["result"]).float())))
    verdict = _verdict_of(tmp_path, NB08, DECODE_TEST, floats, sources)
    assert verdict.ename == "CheckFailed" and "torch.bool" in verdict.evalue, verdict.evalue


def _plans(exercises: tuple[str, ...]) -> dict[str, tuple[list[str], int]]:
    """exercise -> (the keys of its hidden plan, the number of its visible steps but a ladder's rungs, which run in
    the visible plan only), as the grader builds them (to be read before a kernel's inputs are set: there the
    hidden cases come only from the plan sent in)."""
    from course_utils import checks

    return {e: ([s.key for s in checks.SPECS[e].steps(True)],
                len([s for s in checks.SPECS[e].steps(False) if not ladder.is_rung(s)])) for e in exercises}


def _hidden_in_plan(exercise: str, hidden: list, plans: dict) -> None:
    """The hidden cases of a spec's exercise reach the kernel inside the plan the grader sends in (``probe.plan``),
    after the visible steps, as they went."""
    sent = probe.plan(exercise, True)
    keys, visible = plans[exercise]
    assert [k for k, _, _ in sent] == keys and len(sent) > visible
    for case in hidden:
        found = next(c for k, c, _ in sent if c.name == case.name)
        assert all((torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b) for a, b in zip(found.args, case.args))


def test_notebook_08s_hidden_cases_reach_the_kernel_as_data(monkeypatch):
    from course_utils.checks import expected

    plans = _plans(("repeat_kv", "sliding_window_mask", "GroupedQueryAttention", "MultiHeadAttentionKVCache"))
    handoff = judge.prepare(NB08)
    try:
        assert {"decode_causal_mask", "rope_angles", "repeat_kv", "sliding_window_mask"} <= set(handoff.exercises)
        assert "GroupedQueryAttention" in handoff.exercises
        assert "MultiHeadAttentionKVCache" in handoff.exercises
        assert handoff.student_edition  # check_alone's first tries are made in a kernel of their own
        monkeypatch.setenv(probe.DIR_VARIABLE, handoff.outputs)
        monkeypatch.setenv(probe.INPUTS_VARIABLE, handoff.inputs)
        monkeypatch.setattr(probe, "_inputs", None)
        for exercise in ("repeat_kv", "sliding_window_mask"):
            want = expected.instructor().hidden(exercise)
            assert want
            _hidden_in_plan(exercise, want, plans)
        want = expected.instructor().hidden("GroupedQueryAttention")  # its hidden constructions and inputs: passes
        assert want["not_dividing"] and want["configs"]
        sent = probe.plan("GroupedQueryAttention", True)
        assert [k for k, _, _ in sent] == plans["GroupedQueryAttention"][0]
        assert all(f"module {tuple(build)}" in plans["GroupedQueryAttention"][0] for build in want["not_dividing"])
        passes = [p[3] for _, c, _ in sent for p in c.args[0]]
        assert all(any(x.shape == c.args[0].shape and torch.equal(x, c.args[0]) for x in passes)
                   for _, cases in want["configs"] for c in cases)
        want = expected.instructor().hidden("MultiHeadAttentionKVCache")  # sequences read in pieces: sessions
        sent = probe.plan("MultiHeadAttentionKVCache", True)
        assert want and [k for k, _, _ in sent] == plans["MultiHeadAttentionKVCache"][0]
        for case in want:
            found = next(c for k, c, _ in sent if k.startswith("decode ") and c.name == case.name)
            chunks = [op[1] for op in found.args[0] if op[0] == "forward"]
            assert found.build == case.build and [x.shape[1] for x in chunks][:len(case.chunks)] == case.chunks
            assert torch.equal(torch.cat(chunks[:len(case.chunks)], dim=1), case.args[0].to(case.dtype))
    finally:
        handoff.remove()
        monkeypatch.setattr(probe, "_inputs", None)


#: apply_rope beside a rope_angles of the student's own: one that is wrong (checked with ours, apply_rope keeps
#: its points), and one of another layout that the student's apply_rope relies on (ours fails it; its own passes).
_WRONG_ANGLES = str(_NB08.WRONG["rope_angles"]["positive exponent"])
_OWN_LAYOUT = (_NB08._ANGLES.replace("inv_freq[None, :]", "inv_freq[None, :]).T  # (D/2, P)").replace(
    "    return torch.arange", "    return (torch.arange") + _NB08._ROPE.replace("[positions]", "[:, positions].T"))


@pytest.mark.parametrize("source", [_WRONG_ANGLES + _NB08._ROPE, _OWN_LAYOUT],
                         ids=["a wrong rope_angles of its own", "a rope_angles of its own layout"])
def test_apply_rope_is_judged_outside_with_either_helper(source, monkeypatch, capsys):
    """Both of check_alone's tries are handed out: the verdict outside is the kernel's, full marks here."""
    assert "apply_rope" in judge.spec_of_each()
    want = _inside(NB08, "apply_rope", source)
    assert want and all(ename is None for ename, _ in want.values()), want
    _same_verdict_outside(NB08, "apply_rope", source, monkeypatch, capsys)


def test_apply_ropes_tries_are_read_in_order(tmp_path, monkeypatch):
    """A wrong first try with a right second one passes (the student's own helper); both wrong fail with
    the first try's message; a second try left out scores 0 when the verdict needs it."""
    handoff, _ = _handed_out(NB08, "apply_rope", _OWN_LAYOUT, monkeypatch)
    try:
        records, sources = _load2(handoff.outputs, "test_apply_rope")
    finally:
        handoff.remove()
    # one record per try and per check call: the visible plan's two tries, then the hidden plan's
    assert [(r["plan"], r["attempt"]) for r in records] == [("visible", 1), ("visible", 2), ("hidden", 1), ("hidden", 2)]
    cases = [[(k, o) for k, o in r["outcomes"] if not ladder.is_rung(k)] for r in records[:2]]  # not rungs
    assert all("error" in o for _, o in cases[0]) and all("result" in o for _, o in cases[1])
    verdict = _verdict_of(tmp_path, NB08, "test_apply_rope", records, sources)
    assert verdict.ename is None and "cases agree" in verdict.text, verdict.evalue
    both = _copy(records)
    both[1], both[3] = dict(_copy(records[0]), attempt=2), dict(_copy(records[2]), attempt=2)
    verdict = _verdict_of(tmp_path, NB08, "test_apply_rope", both, sources)
    assert verdict.ename == "CheckFailed" and "your code raised" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB08, "test_apply_rope", _copy(records)[:1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue
    # The marks bound each try: the second try's records unmarked, or marked as the first's, stand for neither.
    for forged in ([{k: v for k, v in r.items() if k != "attempt"} for r in _copy(records)],
                   [dict(r, attempt=1) for r in _copy(records)]):
        verdict = _verdict_of(tmp_path, NB08, "test_apply_rope", forged, sources)
        assert verdict.ename == judge.HANDOFF_ERROR, (verdict.ename, verdict.evalue)


#: GroupedQueryAttention beside a repeat_kv of the student's own: one that is wrong (checked with ours, the class
#: keeps its points), and one taking its arguments the other way round, which the student's class relies on (ours
#: fails it; its own passes).
_GQA_TEST = "test_GroupedQueryAttention"
_WRONG_REPEAT = str(_NB08.WRONG["repeat_kv"]["tiled with repeat"])
_OWN_REPEAT = _NB08._REPEAT.replace("def repeat_kv(x, n_rep):", "def repeat_kv(n_rep, x):") + _NB08._GQA.replace(
    "repeat_kv(split_heads(self.W_key(x), self.G), self.H // self.G)", "repeat_kv(self.H // self.G, split_heads(self.W_key(x), self.G))").replace(
    "repeat_kv(split_heads(self.W_value(x), self.G), self.H // self.G)", "repeat_kv(self.H // self.G, split_heads(self.W_value(x), self.G))")


@pytest.mark.parametrize("source", [_WRONG_REPEAT + _NB08._GQA, _OWN_REPEAT],
                         ids=["a wrong repeat_kv of its own", "a repeat_kv of its own argument order"])
def test_gqa_is_judged_outside_with_either_helper(source, monkeypatch, capsys):
    """Both of check_alone's tries are handed out, each marked: the verdict outside is the kernel's, full marks."""
    assert "GroupedQueryAttention" in judge.spec_of_each()
    want = _inside(NB08, "GroupedQueryAttention", source)
    assert want and all(ename is None for ename, _ in want.values()), want
    _same_verdict_outside(NB08, "GroupedQueryAttention", source, monkeypatch, capsys)


@pytest.fixture(scope="module")
def gqa_own_repeat():
    """What GroupedQueryAttention built on a repeat_kv of its own argument order hands out: ``(records, sources)``."""
    yield from _honest(NB08, "GroupedQueryAttention", _OWN_REPEAT, _GQA_TEST)


def _with_attempt(records: list[dict], attempt) -> list[dict]:
    return [{**r, "attempt": attempt} for r in _copy(records)]


def test_gqas_tries_are_told_apart(tmp_path, gqa_own_repeat):
    """The first try (our repeat_kv) fails and the second (the student's) passes; the second try's outcomes replaced
    by the first's fail with the first try's message; a second try left out, unmarked records, or a try that is
    neither 1 nor 2 score 0 with a reason."""
    records, sources = gqa_own_repeat
    assert [(r["plan"], r.get("attempt")) for r in records] == [("visible", 1), ("visible", 2), ("hidden", 1),
                                                                ("hidden", 2)]

    def errors(attempt: int) -> int:  # the probed passes that raised, over every construction of that try (not rungs)
        return sum("error" in p for r in records if r["attempt"] == attempt for k, o in r["outcomes"]
                   if not ladder.is_rung(k) for p in wire.decode(o["result"])["passes"])

    assert errors(1) > 100 and errors(2) == 2, (errors(1), errors(2))  # with ours every pass raises; with its own,
    # only the input too long (once for the visible cases' check, once for the hidden's)
    verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, records, sources)
    assert verdict.ename is None and "outputs agree" in verdict.text, verdict.evalue
    first = [r for r in records if r["attempt"] == 1]
    verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, [first[0], dict(_copy(first[0]), attempt=2), first[1],
                                                       dict(_copy(first[1]), attempt=2)], sources)
    assert verdict.ename == "CheckFailed" and "your code raised" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, first, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "came back" in verdict.evalue, verdict.evalue
    unmarked = [{k: v for k, v in r.items() if k != "attempt"} for r in _copy(records)]
    verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, unmarked, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "came back" in verdict.evalue, verdict.evalue
    for attempt in (3, "1", True):  # malformed: the hand-off is refused (the test scores 0 with this reason)
        with pytest.raises(judge.BadHandOff, match="a try of check_alone other than"):
            _verdict_of(tmp_path, NB08, _GQA_TEST, _with_attempt(records, attempt), sources)


@pytest.fixture(scope="module")
def honest_gqa():
    """What an honest GroupedQueryAttention hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB08, "GroupedQueryAttention", _NB08._GQA, _GQA_TEST)


def test_a_gqa_pass_is_judged_outside_and_a_malformed_one_scores_zero(tmp_path, honest_gqa):
    """A probed pass forged into another output fails as the kernel's check would; a construction's outcome
    without its form, or with fewer passes than its step makes, scores 0."""
    records, sources = honest_gqa

    def change(edit: Callable[[dict], None], attempts: tuple = (1, 2)) -> list[dict]:
        forged = _copy(records)
        for record in (r for r in forged if r["attempt"] in attempts):  # the first construction's step
            outcomes = record["outcomes"]
            found = wire.decode(outcomes[0][1]["result"])
            edit(found)
            outcomes[0][1]["result"] = wire.encode(found)
        return forged

    def too_long_returns(found: dict) -> None:
        for p in found["passes"]:
            if "error" in p:
                p.pop("error")
                p["value"] = torch.zeros(1, 11, 8)

    verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, change(too_long_returns), sources)
    assert verdict.ename == "CheckFailed" and "returned an output instead of raising" in verdict.evalue, verdict.evalue
    for edit in (lambda f: f.pop("passes"), lambda f: f["passes"].clear(), lambda f: f["passes"][0].update(verdict=1)):
        verdict = _verdict_of(tmp_path, NB08, _GQA_TEST, change(edit), sources)
        assert verdict.ename == judge.HANDOFF_ERROR and "what came back from GroupedQueryAttention" in verdict.evalue, \
            verdict.evalue


# --------------------------------------------------------------------------------------------
# Notebook 08's MultiHeadAttentionKVCache: each session (a module, then calls whose outputs depend on the calls
# before them) is one step of the plan, its operations' outcomes and the cache's shape after each cached call
# --------------------------------------------------------------------------------------------
_KV_TEST = "test_MultiHeadAttentionKVCache"
_MAIN = "the main module"


@pytest.fixture(scope="module")
def honest_kv():
    """What an honest MultiHeadAttentionKVCache (built on the notebook's apply_rope) hands out: ``(records, sources)``."""
    yield from _honest(NB08, "MultiHeadAttentionKVCache", _NB08._KV, _KV_TEST)


def _kv_verdict(tmp_path, records, sources) -> judge.Verdict:
    return _verdict_of(tmp_path, NB08, _KV_TEST, records, sources)


def _sessions(records: list[dict], edit: Callable[[str, dict], None], attempts: tuple = (1, 2)) -> list[dict]:
    """A copy of ``records`` where ``edit(key, session)`` changed each session (decoded: ``{"built", "steps"}``) of
    the tries ``attempts``."""
    forged = _copy(records)
    for record in (r for r in forged if r.get("attempt") in attempts):
        for key, outcome in record["outcomes"]:
            found = wire.decode(outcome["result"])
            edit(key, found)
            outcome["result"] = wire.encode(found)
    return forged


def test_an_honest_kv_cache_hand_off_passes(tmp_path, honest_kv):
    """Both tries come back, each session as one outcome: its operations' outcomes in order, the cache's shape
    after each cached call, what the cache is made of."""
    records, sources = honest_kv
    assert [(r["plan"], r["attempt"]) for r in records] == [("visible", 1), ("visible", 2), ("hidden", 1),
                                                            ("hidden", 2)]
    main = wire.decode(dict(records[1]["outcomes"])[_MAIN]["result"])["steps"]
    assert main[1]["cache"] == [2, 2, 3, 4] and main[2]["value"]["cache_k"] == ["Tensor", True, False]
    assert [o.get("error", [None])[0] for o in main[3:9]] == [None, None, None, "ValueError", None, "ValueError"]
    # past context_length, then an empty prompt
    verdict = _kv_verdict(tmp_path, records, sources)
    assert verdict.ename is None and "again after reset_cache()" in verdict.text, verdict.evalue


def test_a_kv_cache_session_cut_short_or_left_out_scores_zero(tmp_path, honest_kv):
    """A session with fewer outcomes than its operations, or a malformed one, or a session left out: each scores
    0 with the reason; two cached calls swapped earn nothing."""
    records, sources = honest_kv
    cut = _sessions(records, lambda key, found: found["steps"].pop() if key == _MAIN else None)
    verdict = _kv_verdict(tmp_path, cut, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "MultiHeadAttentionKVCache's session" in verdict.evalue, \
        verdict.evalue
    verdict = _kv_verdict(tmp_path, _drop_outcome(records, "MultiHeadAttentionKVCache", lambda k: k == _MAIN), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue

    def swap(key: str, found: dict) -> None:
        if key.startswith("decode 0:"):
            steps = found["steps"]
            steps[3], steps[4] = steps[4], steps[3]

    verdict = _kv_verdict(tmp_path, _sessions(records, swap), sources)
    assert verdict.ename == "CheckFailed" and "differ from forward(x) on the whole sequence" in verdict.evalue, \
        verdict.evalue


def test_a_forged_kv_cache_session_loses_the_points(tmp_path, honest_kv):
    """A forged cached output, or a cache said to be saved in state_dict, fails as the kernel's own check would;
    the first try's sessions alone (the second left out, where the verdict needs it) score 0."""
    records, sources = honest_kv

    def next_token(key: str, found: dict) -> None:
        step = found["steps"][3] if key.startswith("decode ") else {}
        if isinstance(step.get("value"), torch.Tensor):
            step["value"] = step["value"] + 1  # the prompt's next token, with the cache

    verdict = _kv_verdict(tmp_path, _sessions(records, next_token), sources)
    assert verdict.ename == "CheckFailed" and "differ from forward(x) on the whole sequence" in verdict.evalue, \
        verdict.evalue

    def saved(key: str, found: dict) -> None:
        if key == _MAIN:
            found["steps"][2]["value"]["cache_k"][2] = True

    verdict = _kv_verdict(tmp_path, _sessions(records, saved), sources)
    assert verdict.ename == "CheckFailed" and "state_dict() holds ['cache_k']" in verdict.evalue, verdict.evalue
    broken = [r for r in _sessions(records, next_token, (1,)) if r["attempt"] != 2]
    verdict = _kv_verdict(tmp_path, broken, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "came back" in verdict.evalue, verdict.evalue


@pytest.mark.parametrize("forge", [
    lambda s: s.__setitem__("verdict", "pass"),
    lambda s: s["steps"][0].__setitem__("verdict", "pass"),
    lambda s: s["steps"][0].__setitem__("error", ["ValueError", "x"]),
    lambda s: s["steps"][2].__setitem__("value", {"cache_k": ["Tensor", True]}),
    lambda s: s.__setitem__("steps", "all passed"),
], ids=["extra field", "a step's extra field", "a result and an error", "buffers cut short", "steps not a list"])
def test_a_malformed_kv_cache_session_is_refused(tmp_path, honest_kv, forge):
    records, sources = honest_kv
    forged = _sessions(records, lambda key, found: forge(found) if key == _MAIN else None)
    verdict = _kv_verdict(tmp_path, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "what came back from MultiHeadAttentionKVCache" in verdict.evalue, \
        verdict.evalue


# --------------------------------------------------------------------------------------------
# Notebook 07: the tiled attention's outputs and what the tensor watcher saw, the Triton kernel's launches
# --------------------------------------------------------------------------------------------
NB07 = "07_flash_attention_from_scratch"
_NB07 = load(NB07)
OS_TEST, FA_TEST, TRITON_TEST = "test_online_softmax", "test_flash_attention_forward", "test_flash_attention_triton"


@pytest.fixture(scope="module")
def honest_online():
    """What an honest online_softmax hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB07, "online_softmax", _NB07._OS, OS_TEST)


@pytest.fixture(scope="module")
def honest_flash():
    """What an honest flash_attention_forward hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB07, "flash_attention_forward", _NB07._FA, FA_TEST)


@pytest.fixture(scope="module")
def honest_triton():
    """What an honest flash_attention_triton hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB07, "flash_attention_triton", _NB07._kernel(_NB07._LOOP), TRITON_TEST)


def _forged(records: list[dict], key: str, value: dict | None = None, error: dict | None = None) -> list[dict]:
    """``records`` with the outcome of step ``key`` set to the result ``value`` (plain data, as ``wire.encode``
    writes it) or the error ``error``, in every plan handed out (visible and hidden, each try): a forger
    controls them all."""
    forged = _copy(records)
    for record in forged:
        for item in record["outcomes"]:
            if item[0] == key:
                item[1] = {"result": value} if error is None else {"error": error}
    return forged


def _renamed(records: list[dict], key: str, new: str) -> list[dict]:
    """``records`` with the step ``key`` handed out under another key, in every plan."""
    forged = _copy(records)
    for record in forged:
        for item in record["outcomes"]:
            if item[0] == key:
                item[0] = new
    return forged


def _watched(records: list[dict]) -> list[str]:
    """The keys of the watched steps, in the order of the plans (``nb07.WATCHED``)."""
    return [key for r in records for key in _outcomes(r) if key.startswith("watched: ")]


def test_an_honest_online_softmax_hand_off_passes(tmp_path, honest_online):
    """The outputs of every case, then what the watcher saw of the streaming run: no whole row reduced (for the
    visible check call, then for the hidden one), then, in the visible plan only, the ladder's rungs
    (checks/ladder.py: tiny cases, each its output)."""
    from course_utils.checks import nb07

    records, sources = honest_online
    assert [r["plan"] for r in records] == ["visible", "hidden"]
    for record in records:
        rungs = len(ladder.steps(nb07.ONLINE_LADDER, record["plan"] == "hidden"))
        outcomes, rung_outcomes = record["outcomes"][:len(record["outcomes"]) - rungs], record["outcomes"][-rungs:][:rungs]
        assert [k for k, _ in rung_outcomes] == [s.key for s in ladder.steps(nb07.ONLINE_LADDER, record["plan"] == "hidden")]
        assert outcomes[-1][0].startswith("watched: ") and outcomes[-1][1] == {"result": {"kind": "none"}}
        assert {o["result"]["kind"] for _, o in outcomes[:-1] + rung_outcomes} == {"tensor"}
    verdict = _verdict_of(tmp_path, NB07, OS_TEST, records, sources)
    assert verdict.ename is None and "reduced one block at a time" in verdict.text, verdict.evalue


@pytest.mark.parametrize("seen", [
    {"kind": "text", "value": "fine"},
    {"kind": "list", "items": [{"kind": "text", "value": "amax"}, {"kind": "number", "type": "int", "value": 4},
                               {"kind": "text", "value": ""}]},  # a "whole row" no longer than a block
    {"kind": "list", "items": [{"kind": "text", "value": "amax"}, {"kind": "number", "type": "float", "value": 12.0},
                               {"kind": "text", "value": ""}]},
    {"kind": "list", "items": [{"kind": "text", "value": "amax"}]},
], ids=["a text", "a row of one block", "a float count of columns", "too short"])
def test_a_malformed_streaming_outcome_scores_zero(tmp_path, honest_online, seen):
    records, sources = honest_online
    forged = _forged(records, _watched(records)[0], seen)
    verdict = _verdict_of(tmp_path, NB07, OS_TEST, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "online_softmax's tensor watcher" in verdict.evalue, \
        verdict.evalue


def test_a_whole_row_reduced_is_judged_outside(tmp_path, honest_online):
    """The message is built outside from the data the kernel handed out; an outcome under a key the plan does
    not make, or a plan's outcomes missing, are refused."""
    records, sources = honest_online
    key = _watched(records)[0]
    whole = _forged(records, key, wire.encode(["amax", 12, "line 3: `m = x.amax(dim=-1, keepdim=True)`"]))
    verdict = _verdict_of(tmp_path, NB07, OS_TEST, whole, sources)
    assert verdict.ename == "CheckFailed" and "reduced a whole row of 12 columns at once at line 3" in verdict.evalue \
        and "the blocks have only 4" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, OS_TEST, _renamed(records, key, "watched: another run"), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, OS_TEST, _copy(records)[:-1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue


def test_an_honest_flash_hand_off_passes(tmp_path, honest_flash):
    """Per case its (out, lse), then what the watcher saw of it: the first (T, T) tensor made, if any, and the
    score entries computed; then one more watched run of its own, per check call; the bfloat16 case; then the
    ladder's rungs (checks/ladder.py: tiny cases, each its (out, lse))."""
    from course_utils.checks import nb07

    records, sources = honest_flash
    counts = []
    for record in records:
        outcomes = _outcomes(record)
        rungs = [k for k in outcomes if ladder.is_rung(k)]  # in the visible plan only
        assert rungs == [s.key for s in ladder.steps(nb07.FORWARD_LADDER, record["plan"] == "hidden")]
        assert all(outcomes[k]["result"]["kind"] == "tuple" for k in rungs)
        half = [k for k in outcomes if k.startswith(nb07.HALF)]  # the bfloat16 case: a plain call
        calls = [k for k in outcomes if not ladder.is_rung(k) and not k.startswith(("watched: ", nb07.HALF))]
        assert len(half) == 1 and len(outcomes) == 2 * len(calls) + 1 + len(rungs) + len(half)
        assert all(f"watched: {k}" in outcomes for k in calls)
        assert all(outcomes[k]["result"]["kind"] == "tuple" for k in calls)
        for key in (k for k in outcomes if k.startswith("watched: ")):
            big, count = outcomes[key]["result"]["items"]
            assert big["kind"] in ("none", "list") and count["type"] == "int"  # a (T, T) tensor only where T is small
            counts.append(count["value"])
    assert max(counts) > 0, counts
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, records, sources)
    assert verdict.ename is None and "causal tiles wholly in the future are skipped" in verdict.text, verdict.evalue


@pytest.mark.parametrize("seen", [
    {"kind": "list", "items": [{"kind": "none"}, {"kind": "number", "type": "int", "value": -1}]},
    {"kind": "list", "items": [{"kind": "none"}, {"kind": "number", "type": "bool", "value": True}]},
    {"kind": "list", "items": [{"kind": "none"}]},
    {"kind": "list", "items": [wire.encode([[37, 37.5], False, ""]), {"kind": "number", "type": "int", "value": 0}]},
    {"kind": "list", "items": [wire.encode([[37, 37], "mask", ""]), {"kind": "number", "type": "int", "value": 0}]},
    {"kind": "none"},
], ids=["a negative count", "a bool count", "no count", "a shape of floats", "a mask flag that is text", "None"])
def test_a_malformed_structure_outcome_scores_zero(tmp_path, honest_flash, seen):
    records, sources = honest_flash
    forged = _forged(records, _watched(records)[0], seen)
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, forged, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "flash_attention_forward's tensor watcher" in verdict.evalue, \
        verdict.evalue


def test_what_the_watcher_saw_is_judged_outside(tmp_path, honest_flash):
    """A (T, T) tensor and a count of every tile, handed out, get their messages outside; a forged output
    loses its points; outcomes under keys the plan does not make, or missing, are refused."""
    records, sources = honest_flash
    key = "watched: (1, 2, 37, 8), block_q=8, block_k=16, causal: T not a multiple of the blocks"
    honest = _outcomes(records[0])[key]["result"]
    big = _copy(honest)
    big["items"][0] = wire.encode([[37, 37], True, "line 9: `mask = torch.ones(T, T)`"])
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, _forged(records, key, big), sources)
    assert verdict.ename == "CheckFailed" and "made a tensor of shape (37, 37) at line 9" in verdict.evalue \
        and "a mask" in verdict.evalue, verdict.evalue
    every = _copy(honest)
    every["items"][1]["value"] = 2 * 37 * 37
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, _forged(records, key, every), sources)
    assert verdict.ename == "CheckFailed" and "no key block was skipped" in verdict.evalue, verdict.evalue
    call = key.removeprefix("watched: ")
    wrong = _copy(_outcomes(records[0])[call]["result"])
    wrong["items"][0]["value"] = wrong["items"][0]["value"] * 2
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, _forged(records, call, wrong), sources)
    assert verdict.ename == "CheckFailed" and "out:" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, _renamed(records, call, "(1, 2, 37, 8), another case"), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, FA_TEST, _copy(records)[:-1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue


def _launches(records: list[dict]) -> list[tuple[str, dict]]:
    """``(key, outcome)`` of every launch handed out, in order."""
    return [(key, outcome) for r in records for key, outcome in r["outcomes"]]


def test_an_honest_triton_hand_off_passes_and_a_forged_one_does_not(tmp_path, honest_triton):
    """Each launch's (out, lse) comes back and is compared outside with the reference; a forged launch loses
    the points, with the reason; outcomes missing, or more than the test asked for, score 0."""
    records, sources = honest_triton
    assert all(o["result"]["kind"] == "list" and o["result"]["items"][0]["kind"] == "tuple"
               and o["result"]["items"][1] == {"kind": "text", "value": "cpu"} for _, o in _launches(records))
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, records, sources)
    assert verdict.ename is None and "launches agree with attention" in verdict.text, verdict.evalue
    assert "in Triton's interpreter on the CPU" in verdict.text, verdict.text
    (first, honest), (second, _) = _launches(records)[:2]
    zeros = _copy(honest["result"])
    lse = zeros["items"][0]["items"][1]
    lse["value"] = torch.zeros_like(lse["value"])
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, _forged(records, first, zeros), sources)
    assert verdict.ename == "CheckFailed" and "lse:" in verdict.evalue, verdict.evalue
    raised = _forged(records, second, error={"type": "ValueError", "message": "incompatible reduction dimensions"})
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, raised, sources)
    assert verdict.ename == "CheckFailed" and "tl.dot needs the inner sizes to agree" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, _renamed(records, first, "another launch"), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, _copy(records)[:-1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue
    more = _copy(records) + _copy(records)[:1]
    verdict = _verdict_of(tmp_path, NB07, TRITON_TEST, more, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "more outputs came back" in verdict.evalue, verdict.evalue


@pytest.mark.parametrize("notebook, test, fixture", [(NB07, TRITON_TEST, "honest_triton"),
                                                     ("10_flash_attention_backward", "test_flash_attention_backward_triton",
                                                      "honest_backward_triton")])
def test_where_a_launch_ran_is_read_from_the_hand_off(tmp_path, request, notebook, test, fixture):
    """The sandboxed kernel may see no GPU where the grader's process does: the tolerance and the message
    follow where each launch ran, as handed out; anything but "gpu" or "cpu" there scores 0."""
    records, sources = request.getfixturevalue(fixture)

    def where(found: list[dict], value: str, only: str | None = None) -> list[dict]:
        for key, outcome in _launches(found):
            if only is None or key == only:
                outcome["result"]["items"][1]["value"] = value
        return found

    gpu = where(_copy(records), "gpu")
    verdict = _verdict_of(tmp_path, notebook, test, gpu, sources)
    assert verdict.ename is None and "compiled for the GPU" in verdict.text, verdict.evalue
    looser = _copy(gpu)
    first_key = _launches(looser)[0][0]
    for key, outcome in _launches(looser):
        if key == first_key:
            first = outcome["result"]["items"][0]["items"][0]
            first["value"] = first["value"] + 1e-3  # within the GPU's tolerance (5e-3), not the interpreter's (1e-5)
    verdict = _verdict_of(tmp_path, notebook, test, looser, sources)
    assert verdict.ename is None, verdict.evalue
    verdict = _verdict_of(tmp_path, notebook, test, where(looser, "cpu"), sources)
    assert verdict.ename == "CheckFailed", verdict.text
    odd = where(_copy(records), "tpu", first_key)
    verdict = _verdict_of(tmp_path, notebook, test, odd, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "where it ran" in verdict.evalue, verdict.evalue


# --------------------------------------------------------------------------------------------
# Notebook 10: gradients, what the tensor watcher saw, the autograd Function's runs and make-up, the Triton kernel
# --------------------------------------------------------------------------------------------
NB10 = "10_flash_attention_backward"
_NB10 = load(NB10)
FN_TEST, FB_TEST, BT_TEST = "test_FlashAttention", "test_flash_attention_backward", "test_flash_attention_backward_triton"


@pytest.fixture(scope="module")
def honest_function():
    """What an honest FlashAttention hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB10, "FlashAttention", _NB10._FN, FN_TEST)


def test_an_honest_function_hand_off_passes(tmp_path, honest_function):
    """What the class is, each run's (o, dq, dk, dv), what forward keeps and gradcheck's word come back as data,
    in each try of modules.alone."""
    records, sources = honest_function
    assert len(_tries(records)) == 2 and all(len(run) == 2 for run in _tries(records))  # visible and hidden calls
    for record in records:
        outcomes = _outcomes(record)
        assert outcomes["kind"] == {"result": {"kind": "number", "type": "bool", "value": True}}
        kept = outcomes["kept"]["result"]["items"]
        assert kept[0] == {"kind": "none"} and [e["items"][1]["value"] for e in kept[1]["items"]] == [
            "q", "k", "v", "o", "lse"]
        assert outcomes["gradcheck"] == {"result": {"kind": "none"}}
    verdict = _verdict_of(tmp_path, NB10, FN_TEST, records, sources)
    assert verdict.ename is None and "gradcheck passes" in verdict.text, verdict.evalue


@pytest.mark.parametrize("key, value, words", [
    ("kind", {"kind": "number", "type": "int", "value": 1}, "FlashAttention's kind"),
    ("kept", wire.encode([None, [[[1, 2, 24, 4], "P"]], [], None]), "record of what it keeps"),
    ("kept", wire.encode([None, [], [["not a name", [24]]], None]), "record of what it keeps"),
    ("kept", wire.encode([["Oops", "no"], [], []]), "record of what it keeps"),
    ("gradcheck", wire.encode(["agrees", ""]), "FlashAttention's gradcheck"),
], ids=["a count for a kind", "a saved tensor of another name", "an attribute that is not a name", "too short",
        "gradcheck's word off the list"])
def test_a_malformed_function_outcome_scores_zero(tmp_path, honest_function, key, value, words):
    records, sources = honest_function
    verdict = _verdict_of(tmp_path, NB10, FN_TEST, _forged(records, key, value), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and words in verdict.evalue, verdict.evalue


def test_what_the_function_is_and_keeps_is_judged_outside(tmp_path, honest_function):
    """The messages are built outside from the data handed out: not a Function, P saved, a tensor on ctx,
    gradcheck disagreeing; a missing plan's outcomes score 0 with the reason."""
    records, sources = honest_function
    said = {
        "not a Function": (_forged(records, "kind", wire.encode(False)), "subclasses torch.autograd.Function"),
        "P saved": (_forged(records, "kept", wire.encode([None, [[[1, 2, 24, 24], None]], [], None])),
                    "ctx.save_for_backward keeps a tensor of shape (1, 2, 24, 24)"),
        "lse on ctx": (_forged(records, "kept", wire.encode([None, [], [["lse", [1, 2, 24]]], None])),
                       "tensors are kept as attributes of ctx (ctx.lse)"),
        "lse missing": (_forged(records, "kept", wire.encode([None, [[[1, 2, 24, 4], n] for n in "qkvo"], [], None])),
                        "missing lse"),
        "gradcheck": (_forged(records, "gradcheck", wire.encode(["disagrees", "Jacobian mismatch for output 0"])),
                      "gradcheck disagrees"),
    }
    for label, (forged, words) in said.items():
        verdict = _verdict_of(tmp_path, NB10, FN_TEST, forged, sources)
        assert verdict.ename == "CheckFailed" and words in verdict.evalue, (label, verdict.evalue)
    verdict = _verdict_of(tmp_path, NB10, FN_TEST, _copy(records)[:1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue


@pytest.fixture(scope="module")
def honest_backward():
    """What an honest flash_attention_backward hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB10, "flash_attention_backward", _NB10._FB, FB_TEST)


def test_an_honest_backward_hand_off_passes_and_its_watcher_outcome_is_judged_outside(tmp_path, honest_backward):
    records, sources = honest_backward
    watched = _watched(records)
    assert watched and all(len(_outcomes(r)[k]["result"]["items"]) == 2 for r in records for k in _outcomes(r)
                           if k in watched)
    verdict = _verdict_of(tmp_path, NB10, FB_TEST, records, sources)
    assert verdict.ename is None and "causal tiles wholly in the future are skipped" in verdict.text, verdict.evalue
    # The T = 40 case, (2, 40, 4), block_q=8, block_k=16, watched in each check call.
    key = "watched: tiles: (2, 40, 4), block_q=8, block_k=16, causal"
    honest = _outcomes(records[0])[key]["result"]
    every = _copy(honest)
    every["items"][1]["value"] = 2 * 2 * 40 * 40
    verdict = _verdict_of(tmp_path, NB10, FB_TEST, _forged(records, key, every), sources)
    assert verdict.ename == "CheckFailed" and "no tile was skipped" in verdict.evalue, verdict.evalue
    big = _copy(honest)
    big["items"][0] = wire.encode([[2, 40, 40], False, ""])
    verdict = _verdict_of(tmp_path, NB10, FB_TEST, _forged(records, key, big), sources)
    assert verdict.ename == "CheckFailed" and "FlashAttention's backward never" in verdict.evalue, verdict.evalue
    malformed = _copy(honest)
    malformed["items"][1] = {"kind": "number", "type": "float", "value": 3.0}
    verdict = _verdict_of(tmp_path, NB10, FB_TEST, _forged(records, key, malformed), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "flash_attention_backward's tensor watcher" in verdict.evalue, \
        verdict.evalue


@pytest.fixture(scope="module")
def honest_backward_triton():
    """What an honest flash_attention_backward_triton hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB10, "flash_attention_backward_triton", _NB10._kernel(_NB10._LOOP), BT_TEST)


def test_an_honest_backward_kernel_hand_off_passes_and_a_forged_one_does_not(tmp_path, honest_backward_triton):
    records, sources = honest_backward_triton
    assert all(o["result"]["kind"] == "list" and o["result"]["items"][0]["kind"] == "tuple"
               for _, o in _launches(records))
    verdict = _verdict_of(tmp_path, NB10, BT_TEST, records, sources)
    assert verdict.ename is None and "launches agree with autograd" in verdict.text, verdict.evalue
    first, honest = _launches(records)[0]
    zeros = _copy(honest["result"])
    dv = zeros["items"][0]["items"][1]
    dv["value"] = torch.zeros_like(dv["value"])
    verdict = _verdict_of(tmp_path, NB10, BT_TEST, _forged(records, first, zeros), sources)
    assert verdict.ename == "CheckFailed" and "dv:" in verdict.evalue, verdict.evalue
    verdict = _verdict_of(tmp_path, NB10, BT_TEST, _copy(records)[:1], sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "no outcomes came back" in verdict.evalue, verdict.evalue


# --------------------------------------------------------------------------------------------
# Notebook 09, in part: sinusoidal_positions, train_step (its traces as data), LearnedPositionalEmbedding (keyed)
# --------------------------------------------------------------------------------------------
NB09 = "09_capstone_tiny_transformer"
_NB09 = load(NB09)
STEP_TEST, LEARNED_TEST, SINUSOID_TEST = "test_train_step", "test_LearnedPositionalEmbedding", "test_sinusoidal_positions"


@pytest.mark.parametrize("source", [
    "import numpy as np\n" + _NB09._STEP.replace("return loss.item()", "return np.float64(loss.item())"),
    _NB09._STEP.replace("return loss.item()", "return loss.item(), logits.shape"),
    _NB09._STEP.replace("    inputs, targets, answer_mask = batch\n", "    inputs, targets, answer_mask = batch\n"
                        "    if answer_mask.all(dim=1).any():\n        raise KeyError('all answers')\n"),
], ids=["numpy's float64", "a tuple", "raises on one spec only"])
def test_every_kind_of_step_outcome_replays_to_the_same_verdict(source, monkeypatch, capsys):
    _same_verdict_outside(NB09, "train_step", source, monkeypatch, capsys)


@pytest.fixture(scope="module")
def honest_step():
    """What an honest train_step hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB09, "train_step", _NB09._STEP, STEP_TEST)


def test_an_honest_step_hand_off_passes_and_a_forged_one_does_not(tmp_path, honest_step):
    """Each spec's trace comes back as plain data, under the spec's key; a forged loss, or another spec's trace,
    fails as the kernel's check would, and a trace without its form, or missing, scores 0."""
    records, sources = honest_step
    outcomes = _outcomes_of(records, "train_step")[0]
    assert [i["kind"] for i in outcomes[0][1]["result"]["items"]] == ["list"] * 4 and outcomes[0][0].startswith("SGD")
    verdict = _verdict_of(tmp_path, NB09, STEP_TEST, records, sources)
    assert verdict.ename is None and "runs of two steps agree" in verdict.text, verdict.evalue
    first = lambda key: key == outcomes[0][0]  # noqa: E731
    forged = _forge_outcome(records, "train_step", first,
                            lambda o: o["result"]["items"][0]["items"][1].update(value=o["result"]["items"][0]["items"][1]["value"] + 0.5))
    verdict = _verdict_of(tmp_path, NB09, STEP_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "step 2: the returned loss is" in verdict.evalue, verdict.evalue
    for forge in ("a step left out", "a parameter as a number", "a word as a number"):
        def change(outcome: dict) -> None:
            items = outcome["result"]["items"]
            if forge == "a step left out":
                for part in items:
                    part["items"].pop()
            elif forge == "a parameter as a number":
                items[3]["items"][0]["items"][0] = {"kind": "number", "type": "float", "value": 1.0}
            else:
                items[1]["items"][0] = {"kind": "number", "type": "int", "value": 1}
        verdict = _verdict_of(tmp_path, NB09, STEP_TEST, _forge_outcome(records, "train_step", first, change), sources)
        assert verdict.ename == judge.HANDOFF_ERROR and "train_step's steps" in verdict.evalue, (forge, verdict.evalue)
    swapped = _copy(records)
    for found in _outcomes_of(swapped, "train_step"):
        found[0][1], found[1][1] = found[1][1], found[0][1]
    verdict = _verdict_of(tmp_path, NB09, STEP_TEST, swapped, sources)
    assert verdict.ename == "CheckFailed", verdict.evalue  # another spec's trace earns nothing
    verdict = _verdict_of(tmp_path, NB09, STEP_TEST, _drop_outcome(records, "train_step", first), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue


@pytest.fixture(scope="module")
def honest_learned():
    """What an honest LearnedPositionalEmbedding hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB09, "LearnedPositionalEmbedding", _NB09._LEARNED, LEARNED_TEST)


def _probed(records: list[dict], exercise: str, edit: Callable[[list, list], None]) -> list[dict]:
    """A copy of ``records`` where ``edit(passes, planned)`` changed the passes of each probed construction of
    ``exercise`` (``planned``: the passes its step makes, ``(mode, seed, copy, x, kwargs)``, from the spec)."""
    from course_utils import checks

    forged = _copy(records)
    for record in (r for r in forged if r["exercise"] == exercise):
        steps = {s.key: s for s in checks.SPECS[exercise].steps(record["plan"] == "hidden")}
        for key, outcome in record["outcomes"]:
            found = wire.decode(outcome["result"])
            edit(found["passes"], steps[key].case.args[0])
            outcome["result"] = wire.encode(found)
    return forged


def test_an_honest_learned_hand_off_passes_and_its_probes_are_judged_outside(tmp_path, honest_learned):
    """Every forward pass the check makes is a pass of its construction's step (``start=`` among them); one left
    out scores 0, one forged fails as the kernel's own check would."""
    from course_utils import checks

    records, sources = honest_learned
    planned = [p for s in checks.SPECS["LearnedPositionalEmbedding"].steps(True) for p in s.case.args[0]]
    assert [p[4]["start"] for p in planned if p[4]] == [5, 6], planned  # a visible case, and one too long
    assert [(r["plan"], len(r["outcomes"])) for r in records] == [("visible", 2), ("hidden", 3)] or records
    verdict = _verdict_of(tmp_path, NB09, LEARNED_TEST, records, sources)
    assert verdict.ename is None and "positions past context_length raise" in verdict.text, verdict.evalue

    def start_6(planned: list) -> int | None:
        return next((i for i, p in enumerate(planned) if p[4] and p[4].get("start") == 6), None)

    def gone(passes: list, planned: list) -> None:
        if start_6(planned) is not None:
            del passes[start_6(planned):]

    verdict = _verdict_of(tmp_path, NB09, LEARNED_TEST, _probed(records, "LearnedPositionalEmbedding", gone), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "fewer than the plan's" in verdict.evalue, verdict.evalue

    def returned(passes: list, planned: list) -> None:
        if start_6(planned) is not None:
            passes[start_6(planned)] = {"value": torch.zeros(1, 3, 4)}

    forged = _probed(records, "LearnedPositionalEmbedding", returned)
    verdict = _verdict_of(tmp_path, NB09, LEARNED_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "returned an output instead of raising" in verdict.evalue, verdict.evalue

    def meta_fails(passes: list, planned: list) -> None:
        for i, p in enumerate(planned):
            if p[2] == "meta":
                passes[i] = {"error": ["RuntimeError", "add got tensors on different devices: cpu and meta"]}

    forged = _probed(records, "LearnedPositionalEmbedding", meta_fails)
    verdict = _verdict_of(tmp_path, NB09, LEARNED_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "after module.to('meta')" in verdict.evalue, verdict.evalue


@pytest.fixture(scope="module")
def honest_sinusoid():
    """What an honest sinusoidal_positions hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB09, "sinusoidal_positions", _NB09._SINUSOID, SINUSOID_TEST)


def test_the_odd_d_model_is_judged_outside(tmp_path, honest_sinusoid):
    """The call with an odd d_model is a step of the plan after the compared ones: left out it scores 0, forged
    into a result it fails as the kernel's check would."""
    from course_utils.checks import nb09

    records, sources = honest_sinusoid
    odd = lambda key: key == nb09._ODD  # noqa: E731
    assert next(o for k, o in _outcomes_of(records, "sinusoidal_positions")[0] if odd(k))["error"]["type"] == "ValueError"
    verdict = _verdict_of(tmp_path, NB09, SINUSOID_TEST, records, sources)
    assert verdict.ename is None and "an odd d_model raises a ValueError" in verdict.text, verdict.evalue
    verdict = _verdict_of(tmp_path, NB09, SINUSOID_TEST, _drop_outcome(records, "sinusoidal_positions", odd), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue

    def returned(outcome: dict) -> None:
        outcome.pop("error")
        outcome["result"] = wire.encode(torch.zeros(4, 5))

    forged = _forge_outcome(records, "sinusoidal_positions", odd, returned)
    verdict = _verdict_of(tmp_path, NB09, SINUSOID_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "must raise a ValueError" in verdict.evalue, verdict.evalue


def test_notebook_09s_hidden_cases_reach_the_kernel_as_data(monkeypatch):
    from course_utils.checks import expected

    from course_utils import checks

    plans = _plans(("train_step", "generate", "LearnedPositionalEmbedding", "TransformerBlock", "TinyGPT"))
    traced = {e: len([s for s in checks.SPECS[e].steps(False) if s.run in ("steps", "generate")
                      and not ladder.is_rung(s)])
              for e in ("train_step", "generate")}  # the visible traces (generate's plan has steps of other runs)
    handoff = judge.prepare(NB09)
    try:
        assert set(handoff.exercises) == {"sinusoidal_positions", "LearnedPositionalEmbedding", "train_step",
                                          "generate", "TransformerBlock", "TinyGPT"}
        assert handoff.student_edition  # every exercise of 09 is judged outside
        monkeypatch.setenv(probe.DIR_VARIABLE, handoff.outputs)
        monkeypatch.setenv(probe.INPUTS_VARIABLE, handoff.inputs)
        monkeypatch.setattr(probe, "_inputs", None)
        for exercise in ("train_step", "generate"):  # specs, as dicts: the kwargs of the plan's hidden steps
            want = expected.instructor().hidden(exercise)
            sent = [c.kwargs for _, c, run in probe.plan(exercise, True) if run in ("steps", "generate")]
            assert want and [k for k, _, _ in probe.plan(exercise, True)] == plans[exercise][0], exercise
            assert sent[traced[exercise]:] == want, exercise
        for exercise in ("LearnedPositionalEmbedding", "TransformerBlock", "TinyGPT"):  # inputs of probed passes
            want = expected.instructor().hidden(exercise)
            sent = probe.plan(exercise, True)
            assert want and [k for k, _, _ in sent] == plans[exercise][0], exercise
            passes = [p[3] for _, c, _ in sent if c.args and isinstance(c.args[0], tuple) for p in c.args[0]]
            assert all(any(x.shape == c.args[0].shape and torch.equal(x, c.args[0]) for x in passes)
                       for _, cases in want for c in cases), exercise
    finally:
        handoff.remove()
        monkeypatch.setattr(probe, "_inputs", None)


GENERATE_TEST = "test_generate"


@pytest.mark.parametrize("source", [
    _NB09._GENERATE.replace("    return tokens\n", "    return tokens.tolist()\n"),
    _NB09._GENERATE.replace("    model.eval()\n", "    model.eval()\n    if max_new_tokens > 6:\n"
                            "        raise RuntimeError('too many tokens')\n"),
], ids=["a list", "an error on some specs"])
def test_every_kind_of_generation_replays_to_the_same_verdict(source, monkeypatch, capsys):
    _same_verdict_outside(NB09, "generate", source, monkeypatch, capsys)


@pytest.fixture(scope="module")
def honest_generate():
    """What an honest generate hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB09, "generate", _NB09._GENERATE, GENERATE_TEST)


def test_an_honest_generate_hand_off_passes_and_a_forged_one_does_not(tmp_path, honest_generate):
    """Per call of generate, its tokens (or what it raised) and the model's calls come back as data, under the
    spec's key; forged tokens or calls fail as the kernel's check would; a trace without its form scores 0."""
    records, sources = honest_generate
    key, outcome = _outcomes_of(records, "generate")[0][0]
    out, error, calls = outcome["result"]["items"][0]["items"]
    assert out["kind"] == "tensor" and error["kind"] == "none" and calls["value"].tolist()[:2] == [[3, 1, 0], [1, 1, 3]]
    verdict = _verdict_of(tmp_path, NB09, GENERATE_TEST, records, sources)
    assert verdict.ename is None and "cases agree with the reference" in verdict.text, verdict.evalue
    first = lambda k: k == key  # noqa: E731

    def token(o: dict) -> None:
        o["result"]["items"][0]["items"][0]["value"][0, -1] += 1

    verdict = _verdict_of(tmp_path, NB09, GENERATE_TEST, _forge_outcome(records, "generate", first, token), sources)
    assert verdict.ename == "CheckFailed" and "row 0, new token 6" in verdict.evalue, verdict.evalue

    def reads(o: dict) -> None:
        o["result"]["items"][0]["items"][2]["value"][1:, 0] = 4  # every step reads the whole sequence

    verdict = _verdict_of(tmp_path, NB09, GENERATE_TEST, _forge_outcome(records, "generate", first, reads), sources)
    assert verdict.ename == "CheckFailed" and "read more than the newest token" in verdict.evalue, verdict.evalue
    for forge in ("a negative count", "a call too many", "an error without its message"):
        def change(o: dict) -> None:
            run = o["result"]["items"][0]["items"]
            if forge == "a negative count":
                run[2]["value"][0, 0] = -1
            elif forge == "a call too many":
                o["result"]["items"].append(o["result"]["items"][0])
            else:
                run[1] = {"kind": "list", "items": [{"kind": "text", "value": "ValueError"}]}
        verdict = _verdict_of(tmp_path, NB09, GENERATE_TEST, _forge_outcome(records, "generate", first, change), sources)
        assert verdict.ename == judge.HANDOFF_ERROR and "what came back from generate" in verdict.evalue, \
            (forge, verdict.evalue)


# --------------------------------------------------------------------------------------------
# Notebook 09's TransformerBlock and TinyGPT: a probed construction per build (test weights, tied parameters,
# context_length), and each build's cached path as a step whose outcome is a trace of plain data (nb09.cached_trace)
# --------------------------------------------------------------------------------------------
BLOCK_TEST, GPT_TEST = "test_TransformerBlock", "test_TinyGPT"


@pytest.fixture(scope="module")
def honest_block():
    """What an honest TransformerBlock hands out for its test cell: ``(records, sources)``."""
    yield from _honest(NB09, "TransformerBlock", _NB09._BLOCK, BLOCK_TEST)


@pytest.fixture(scope="module")
def honest_gpt():
    """What an honest TinyGPT (built on the notebook's block and positions) hands out: ``(records, sources)``."""
    yield from _honest(NB09, "TinyGPT", _NB09._GPT, GPT_TEST)


def _is_cached(key: str) -> bool:
    return key.startswith("cached ")


def _traces(records: list[dict]) -> list[list[dict]]:
    """The parts of every cached path's trace (by reference), encoded: ``[first, num_cached, whole, again, end,
    hints]`` each."""
    return [o["result"]["items"] for r in records for k, o in r["outcomes"] if _is_cached(k)]


def _constructions(records: list[dict], edit: Callable[[dict], None] | None = None) -> list[dict]:
    """Each probed construction's ``built`` (decoded); with ``edit``, a copy of ``records`` where ``edit(built)``
    changed every one of them."""
    if edit is None:
        return [wire.decode(o["result"])["built"] for r in records for k, o in r["outcomes"] if k.startswith("module ")]
    forged = _copy(records)
    for record in forged:
        for key, outcome in record["outcomes"]:
            if key.startswith("module "):
                found = wire.decode(outcome["result"])
                edit(found["built"])
                outcome["result"] = wire.encode(found)
    return forged


def test_an_honest_block_hand_off_passes_and_its_cached_path_is_judged_outside(tmp_path, honest_block):
    """Each build's cached path comes back as one trace of plain data beside its constructions and passes; a forged
    piece fails as the kernel's check would, with its hint read from the trace; pieces swapped fail; a trace left
    out, or one without its form, scores 0."""
    records, sources = honest_block
    assert [r["plan"] for r in records] == ["visible", "hidden"]
    assert len(_traces(records[:1])) == 3 and all(len(t) == 6 for t in _traces(records))  # one per build
    first = _traces(records)[0][0]["items"]
    assert [i["kind"] for i in first] == ["text", "tensor", "tensor", "tensor"] and first[0]["value"] == "ok"
    assert list(first[2]["value"].shape) == [2, 1, 8]  # pieces of 3 + 1 + 2 tokens of the (2, 6, 8) input
    assert not any(b.get("tied") for b in _constructions(records))
    verdict = _verdict_of(tmp_path, NB09, BLOCK_TEST, records, sources)
    assert verdict.ename is None and "fed in pieces with use_cache=True" in verdict.text, verdict.evalue
    forged = _copy(records)
    for trace in _traces(forged):
        pieces = trace[0]["items"]
        pieces[2]["value"] = pieces[2]["value"] + 1
    verdict = _verdict_of(tmp_path, NB09, BLOCK_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "piece 2 (position 3, read after 3 cached tokens)" in verdict.evalue, \
        verdict.evalue
    swapped = _copy(records)
    for trace in _traces(swapped):
        pieces = trace[0]["items"]
        pieces[1], pieces[3] = pieces[3], pieces[1]
    verdict = _verdict_of(tmp_path, NB09, BLOCK_TEST, swapped, sources)
    assert verdict.ename == "CheckFailed" and "piece 1 (positions 0..2" in verdict.evalue, verdict.evalue
    first_key = next(k for k, _ in records[0]["outcomes"] if _is_cached(k))
    verdict = _verdict_of(tmp_path, NB09, BLOCK_TEST, _drop_outcome(records, "TransformerBlock",
                                                                    lambda k: k == first_key), sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "not those of the calls the grader asked for" in verdict.evalue, \
        verdict.evalue
    for forge in ("a piece as a number", "a piece too many", "a trace cut short"):
        malformed = _copy(records)
        for trace in _traces(malformed):
            if forge == "a piece as a number":
                trace[0]["items"][1] = {"kind": "number", "type": "float", "value": 1.0}
            elif forge == "a piece too many":
                trace[0]["items"].append(trace[0]["items"][1])
            else:
                trace.pop()
        verdict = _verdict_of(tmp_path, NB09, BLOCK_TEST, malformed, sources)
        assert verdict.ename == judge.HANDOFF_ERROR and "TransformerBlock's cached path" in verdict.evalue, \
            (forge, verdict.evalue)


def test_an_honest_gpt_hand_off_passes_and_its_forgeries_do_not(tmp_path, honest_gpt):
    """Both of check_alone's tries come back, each marked; a model said to lack context_length, to count no cached
    tokens, or to share its blocks' weights fails as the kernel's check would; unmarked records score 0, a malformed
    try is refused, a malformed tied name or value scores 0; from a student-edition kernel the second try alone
    passes."""
    records, sources = honest_gpt
    assert [(r["plan"], r["attempt"]) for r in records] == [("visible", 1), ("visible", 2), ("hidden", 1),
                                                            ("hidden", 2)]
    from course_utils import checks

    builds = {s.key: s.case.build for s in checks.SPECS["TinyGPT"].steps(True)}
    for record in records:
        for key, outcome in record["outcomes"]:
            build = builds[key]
            if key.startswith("module ") and build[6:7] != ("rotary",):
                assert wire.decode(outcome["result"])["built"]["values"]["context_length"] == build[4]
    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, records, sources)
    assert verdict.ename is None and "reset_cache() starts a new one" in verdict.text, verdict.evalue
    second = [r for r in _copy(records) if r.get("attempt") == 2]
    _write(tmp_path, {"format": probe.FORMAT, "test": GPT_TEST, "records": second, "sources": sources}, GPT_TEST)
    verdict = judge.judge_handed_out(tmp_path, NB09, GPT_TEST, {}, first_tries=False)
    assert verdict.ename is None, verdict.evalue  # a student-edition kernel's hand-off: the second try alone
    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, second, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "came back" in verdict.evalue, verdict.evalue
    forged = _constructions(records, lambda b: b["values"].__setitem__("context_length", None) if "values" in b else None)
    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "keep self.context_length = context_length" in verdict.evalue, \
        verdict.evalue
    forged = _copy(records)
    for trace in _traces(forged):
        trace[1] = {"kind": "number", "type": "int", "value": 0}
    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, forged, sources)
    assert verdict.ename == "CheckFailed" and "model.num_cached is 0, expected 6" in verdict.evalue, verdict.evalue

    def one_set(built: dict) -> None:  # the second block's parameters said to be the first's: one set of weights
        if built.get("module"):
            built["tied"] = [["blocks.1.norm1.weight", "blocks.0.norm1.weight"]]

    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, _constructions(records, one_set), sources)
    assert verdict.ename == "CheckFailed" and "blocks[0] and blocks[1] share one set of weights" in verdict.evalue, \
        verdict.evalue
    unmarked = [{k: v for k, v in r.items() if k != "attempt"} for r in _copy(records)]
    verdict = _verdict_of(tmp_path, NB09, GPT_TEST, unmarked, sources)
    assert verdict.ename == judge.HANDOFF_ERROR and "came back" in verdict.evalue, verdict.evalue
    with pytest.raises(judge.BadHandOff, match="a try of check_alone other than"):
        _verdict_of(tmp_path, NB09, GPT_TEST, _with_attempt(records, 3), sources)
    for edit, words in ((lambda b: b.__setitem__("tied", [["blocks.1.norm1.weight"]]) if b.get("module") else None,
                         "names of the parameters that appear twice"),
                        (lambda b: b.__setitem__("values", {}) if b.get("module") else None, "value of context_length")):
        verdict = _verdict_of(tmp_path, NB09, GPT_TEST, _constructions(records, edit), sources)
        assert verdict.ename == judge.HANDOFF_ERROR and words in verdict.evalue, verdict.evalue
