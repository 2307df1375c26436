"""The hand-off's wire format: what crosses from the grading kernel to the grader, in one place.

The kernel (:mod:`course_utils.checks.probe`) writes one file per test cell with :func:`write_hand_off`;
the grader (``grader/judge.py``) reads it with :func:`read_file`, as untrusted data: the student controls
everything in the kernel, so every limit here is checked as the file is read, nothing is ever unpickled,
and no class is taken from it. A value the student's code gave travels as :func:`encode` writes it, is
refused by :func:`value_problem` when malformed, and is turned back by :func:`decode`; an error travels
as its type name and message (:func:`error_of` raises it again).

The other direction (the grader's plan and hidden inputs, into the kernel) is the grader's own data and
needs no such care: it is a ``torch.save`` file that the kernel reads with ``weights_only=True``.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, Callable

import torch

#: The folder the kernel writes its hand-off to (set by the grader in the sandboxed kernel only).
DIR_VARIABLE = "COURSE_PROBE_DIR"
#: The grader's file of the judged exercises' plans and hidden inputs (read-only in the kernel).
INPUTS_VARIABLE = "COURSE_PROBE_INPUTS"
#: Version of the hand-off format; the grader refuses any other.
FORMAT = 4
#: Longest exception message or text kept, in characters.
MAX_MESSAGE = 2000
#: Longest source of a checked function kept, in characters.
MAX_SOURCE = 100_000
#: How deep a returned list or tuple is followed, and how long it may be.
MAX_DEPTH, MAX_ITEMS = 6, 256
#: Longest whole number handed out as a number, in bits (a longer one goes out as another object: the JSON
#: text of the hand-off would pass the 4,300 digits Python reads back).
MAX_INT_BITS = 4096
#: Most ATen operations named for one exercise.
MAX_OPS = 64


#: Largest hand-off file of one test cell, bytes.
MAX_BYTES = 16 * 1024**2
#: Most outputs handed out by one test cell, and most elements of one returned tensor.
MAX_RECORDS, MAX_ELEMENTS = 2000, 4 * 1024**2
#: Most tensors in one hand-off file.
MAX_TENSORS = 100_000
#: Tensor types a returned value may have.
DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128",
          "int8", "int16", "int32", "int64", "uint8", "bool")


# --------------------------------------------------------------------------------------------
# The hand-off file: JSON for the structure, raw bytes for the tensors (never a pickle)
# --------------------------------------------------------------------------------------------
#: The first bytes of every hand-off file (:func:`write_hand_off`).
HAND_OFF_MAGIC = b"COURSE-HANDOFF\n"
#: The name of a test cell's hand-off file: ``<test id>`` and this.
HAND_OFF_SUFFIX = ".handoff"
#: The one key of the JSON object that stands for a tensor in a hand-off file.
TENSOR_KEY = "__tensor__"


def hand_off_path(folder: str | os.PathLike, test_id: str) -> Path:
    """Where test ``test_id``'s hand-off file is, in ``folder``."""
    return Path(folder) / f"{test_id}{HAND_OFF_SUFFIX}"


def _tensor_bytes(t: torch.Tensor) -> bytes:
    """A tensor's elements in row-major order, as raw bytes (``b""`` where they cannot be read: a
    dtype the grader refuses anyway)."""
    try:
        t = t.detach().cpu().resolve_conj().resolve_neg().contiguous()
        return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
    except (RuntimeError, TypeError, NotImplementedError):  # a quantized tensor, say: not on the grader's list
        return b""


def write_hand_off(data: dict, path: str | os.PathLike) -> None:
    """Write ``data`` (dicts with string keys, lists, strings, numbers, ``None``, ``True``/``False`` and
    tensors; nothing else) as a hand-off file at ``path``, read back by :func:`read_hand_off`.

    The file is :data:`HAND_OFF_MAGIC`, the length ``N`` of the JSON text as 8 bytes little-endian, ``N``
    bytes of UTF-8 JSON (``NaN`` and ``Infinity`` for floats that are), then the tensors' bytes, one after
    the other. In the JSON each tensor is ``{"__tensor__": [dtype, shape, offset, nbytes]}``: its dtype's
    name (``"float32"``), its shape, and where its bytes are in what follows the JSON (row-major,
    this machine's byte order: little-endian on every machine the course runs on). No pickle: the grader
    reads it with ``json`` and ``torch.frombuffer`` alone. Written to a partial file moved into place,
    so a reader never sees half of it. A tuple, or anything else that JSON would not give back as it
    was, is a ``TypeError``.
    """
    import json

    blobs: list[bytes] = []
    size = 0

    def plain(value: Any) -> Any:
        nonlocal size
        if isinstance(value, torch.Tensor):
            raw = _tensor_bytes(value)
            found = {TENSOR_KEY: [_dtype_name(value.dtype), list(value.shape), size, len(raw)]}
            blobs.append(raw)
            size += len(raw)
            return found
        if isinstance(value, dict):
            if not all(isinstance(k, str) for k in value) or set(value) == {TENSOR_KEY}:
                raise TypeError("a hand-off's mappings have string keys, and none is a lone "
                                f"{TENSOR_KEY!r}: {sorted(map(repr, value))[:5]}")
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [plain(v) for v in value]
        if value is None or isinstance(value, (str, int, float)):  # bool is an int
            return value
        raise TypeError(f"a hand-off holds plain data and tensors only, not {type(value).__name__}")

    text = json.dumps(plain(data), ensure_ascii=True, separators=(",", ":")).encode("ascii")
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as f:
        f.write(HAND_OFF_MAGIC + len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    os.replace(partial, path)

class Unreadable(ValueError):
    """A hand-off file that is not one (:func:`read_hand_off`); the message says why."""


def read_hand_off(data: bytes) -> Any:
    """What :func:`write_hand_off` wrote into ``data``, read as untrusted data with ``json`` and
    ``torch.frombuffer`` alone (no pickle): each tensor a new plain CPU tensor of a dtype of :data:`DTYPES`.
    Anything malformed (a truncated file, another header, a JSON length past the end, bad JSON, a key twice
    in one object, nesting deeper than the decoder goes, a tensor of another dtype, a negative size, bytes
    outside the file or not as many as its shape takes, more bytes or tensors than the file holds, a bool that
    is not 0 or 1) raises :class:`Unreadable` saying what. What it gives is plain data, not yet a hand-off:
    the grader reads it as one (``grader/judge.py``) (its checks go only as deep as the hand-off's layout does)."""
    import json
    import math

    import torch

    magic = HAND_OFF_MAGIC
    head = len(magic) + 8
    if not (data.startswith(magic) or magic.startswith(data)):
        raise Unreadable("it does not start with the hand-off's header: not a file written by write_hand_off")
    if len(data) < head:
        raise Unreadable("it is truncated within its header")
    length = int.from_bytes(data[head - 8:head], "little")
    if length > len(data) - head:
        raise Unreadable(f"its JSON of {length:,} bytes runs past the end of the file")
    view = memoryview(data)
    blob = view[head + length:]

    used = [0, 0]  # tensors, bytes

    def tensor(spec: Any) -> torch.Tensor:
        if not (isinstance(spec, list) and len(spec) == 4):
            raise Unreadable("a tensor is not [dtype, shape, offset, nbytes]")
        dtype, shape, offset, nbytes = spec
        if dtype not in DTYPES:
            raise Unreadable(f"a tensor of an unsupported dtype {str(dtype)[:40]!r}")
        if not (isinstance(shape, list) and len(shape) <= 8 and all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
            raise Unreadable("a tensor's shape is not a short list of sizes")
        if not (type(offset) is int and type(nbytes) is int and 0 <= offset and 0 <= nbytes
                and offset + nbytes <= len(blob)):
            raise Unreadable("a tensor's bytes are outside the file")
        kind = getattr(torch, dtype)
        numel = math.prod(shape)
        if nbytes != numel * kind.itemsize:
            raise Unreadable(f"a {dtype} tensor of shape {shape} takes {numel * kind.itemsize:,} bytes, "
                              f"not {nbytes:,}")
        used[0], used[1] = used[0] + 1, used[1] + nbytes
        if used[0] > MAX_TENSORS or used[1] > len(blob):
            raise Unreadable(f"more than {MAX_TENSORS:,} tensors, or more tensor bytes than the file holds")
        if not nbytes:
            return torch.empty(shape, dtype=kind)
        raw = bytearray(blob[offset:offset + nbytes])  # its own memory, writable
        if kind is torch.bool and raw.translate(None, b"\x00\x01"):
            raise Unreadable("a bool tensor holds bytes other than 0 and 1")
        return torch.frombuffer(raw, dtype=kind).reshape(shape)

    def mapping(items: list) -> Any:  # each JSON object, innermost first: a tensor, or a dict
        found = dict(items)
        if len(found) != len(items):
            raise Unreadable("a key appears twice in one JSON object")
        if TENSOR_KEY in found:
            if len(found) != 1:
                raise Unreadable(f"a tensor's {TENSOR_KEY!r} beside other keys")
            return tensor(found[TENSOR_KEY])
        return found

    try:
        return json.loads(str(view[head:head + length], "utf-8"), object_pairs_hook=mapping)
    except RecursionError:  # the decoder's own guard: what it read is dropped
        raise Unreadable("its JSON nests too deep") from None
    except ValueError as exc:  # bad JSON, bad UTF-8, a number too long to read, and each Unreadable above
        raise Unreadable(str(exc)[:200]) from None

def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class BadFile(ValueError):
    """A hand-off file that cannot be used (missing, not a plain file, too large, unreadable); the message
    says why, in words."""


def read_file(folder: str | os.PathLike, test_id: str) -> Any:
    """The plain data test ``test_id``'s hand-off file in ``folder`` holds (:func:`read_hand_off`), read as
    untrusted: :class:`BadFile` for a missing file, a link or special file, a file over :data:`MAX_BYTES`,
    or one that is not in this format."""
    path = hand_off_path(folder, test_id)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise BadFile("no result came back from the kernel for this test") from None
    if not stat.S_ISREG(info.st_mode):
        raise BadFile("the result is not a plain file (a link or a special file)")
    if info.st_size > MAX_BYTES:
        raise BadFile(f"the result is {info.st_size:,} bytes, over the limit of {MAX_BYTES:,}")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise BadFile(f"the result is over the limit of {MAX_BYTES:,} bytes")
    try:
        return read_hand_off(data)
    except Unreadable as exc:
        raise BadFile(f"the result could not be read as plain data ({exc})") from None


def is_name(value: Any) -> bool:
    """Whether ``value`` is a short identifier (an exercise's, an exception type's name)."""
    return isinstance(value, str) and 0 < len(value) <= 100 and value.isidentifier()


#: What a ``special`` verdict of :func:`value_problem` returns for a kind it leaves to that function.
NOT_MINE = "not mine"

def encode(value: Any, depth: int = 0, special: Callable[[Any], dict | None] | None = None) -> dict:
    """A value the student's code gave, as plain data: ``{"kind": "tensor" | "meta" | "number" | "none" |
    "text" | "list" | "tuple" | "dict" (a plain ``dict`` with identifier keys) | "other", ...}`` (:func:`decode` turns it back, :func:`value_problem`
    refuses anything else). ``special(value)``: the plain data of a value the caller encodes its own way
    (a module among a call's inputs), or ``None``."""
    if special is not None:
        found = special(value)
        if found is not None:
            return found
    if isinstance(value, torch.Tensor) and value.device.type == "meta":  # shapes without data (a stand-in for a GPU)
        return {"kind": "meta", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if isinstance(value, torch.Tensor):
        t = value.detach().to("cpu")
        if t.layout != torch.strided:
            return {"kind": "other", "type": type(value).__name__}
        return {"kind": "tensor", "value": t.as_subclass(torch.Tensor).clone()}
    if isinstance(value, int) and int.bit_length(value) > MAX_INT_BITS:  # too long for a hand-off's JSON
        return {"kind": "other", "type": type(value).__name__}
    if isinstance(value, (bool, int, float)):
        return {"kind": "number", "type": type(value).__name__, "value": value}
    if value is None:
        return {"kind": "none"}
    if isinstance(value, str) and len(value) <= MAX_MESSAGE:
        return {"kind": "text", "value": value}
    if isinstance(value, (list, tuple)) and depth < MAX_DEPTH and len(value) <= MAX_ITEMS:
        return {"kind": "list" if isinstance(value, list) else "tuple",  # a subclass (torch.Size) as its base
                "items": [encode(v, depth + 1, special) for v in value]}
    if type(value) is dict and depth < MAX_DEPTH and len(value) <= MAX_ITEMS and all(is_name(k) for k in value):
        return {"kind": "dict", "items": [[k, encode(v, depth + 1, special)] for k, v in value.items()]}
    return {"kind": "other", "type": type(value).__name__}


def value_problem(value: Any, depth: int = 0, special: Callable[[dict], str | None] | None = None) -> str | None:
    """What is wrong with a value handed out as :func:`encode` writes it, if anything (``None``: nothing).
    ``special(value)``: the caller's verdict on a kind of its own (a module among a call's inputs), or
    :data:`NOT_MINE` for a kind it leaves to this function."""
    import torch

    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        return "a value without a kind"
    kind, keys = value["kind"], set(value)
    if special is not None:
        why = special(value)
        if why is not NOT_MINE:
            return why
    if kind == "tensor":
        t = value.get("value")
        if keys != {"kind", "value"} or type(t) is not torch.Tensor:
            return "a tensor value that is not a plain torch.Tensor"
        if t.layout != torch.strided or str(t.dtype).removeprefix("torch.") not in DTYPES or t.device.type != "cpu":
            return f"a tensor of an unsupported type ({t.dtype}, {t.layout})"
        if t.numel() > MAX_ELEMENTS:
            return f"a tensor of {t.numel():,} elements, over the limit of {MAX_ELEMENTS:,}"
        return None
    if kind == "meta":
        if keys != {"kind", "dtype", "shape"}:
            return "a meta tensor with other fields"
        shape, dtype = value["shape"], value["dtype"]
        if dtype not in DTYPES or not (isinstance(shape, list) and len(shape) <= 8
                                       and all(type(n) is int and 0 <= n <= 2**31 for n in shape)):
            return "a meta tensor with a dtype or shape that is malformed"
        return None
    if kind == "number":
        types = {"bool": bool, "int": int, "float": float}
        if keys != {"kind", "type", "value"} or types.get(value["type"]) is not type(value["value"]):
            return "a number whose type is not bool, int or float"
        return None
    if kind == "none":
        return None if keys == {"kind"} else "None with other fields"
    if kind == "text":
        return None if keys == {"kind", "value"} and isinstance(value["value"], str) \
            and len(value["value"]) <= MAX_MESSAGE else "a text value that is not a short string"
    if kind == "dict":
        items = value.get("items")
        if keys != {"kind", "items"} or not isinstance(items, list) or len(items) > MAX_ITEMS or depth >= MAX_DEPTH \
                or not all(isinstance(i, list) and len(i) == 2 and is_name(i[0]) for i in items) \
                or len({i[0] for i in items}) != len(items):
            return "a mapping that is too long, too deep, malformed or with a key twice"
        for _, item in items:
            why = value_problem(item, depth + 1, special)
            if why:
                return why
        return None
    if kind in ("list", "tuple"):
        items = value.get("items")
        if keys != {"kind", "items"} or not isinstance(items, list) or len(items) > MAX_ITEMS \
                or depth >= MAX_DEPTH:
            return "a list or tuple that is too long, too deep or malformed"
        for item in items:
            why = value_problem(item, depth + 1, special)
            if why:
                return why
        return None
    if kind == "other":
        return None if keys == {"kind", "type"} and is_name(value["type"]) else "another object without a type name"
    return f"an unknown kind of value {kind!r}"


def decode(value: dict) -> Any:
    """The value :func:`encode` wrote, as the code that reads it expects: a new tensor, a number, a meta
    tensor of the same dtype and shape, ``None``, a string, a list or a tuple, or (``"other"``) an object
    of a new class of the same name. Only a value :func:`value_problem` passed."""
    kind = value["kind"]
    if kind == "tensor":
        return value["value"].contiguous().clone()
    if kind == "number":
        return value["value"]
    if kind == "meta":
        import torch

        return torch.empty(value["shape"], dtype=getattr(torch, value["dtype"]), device="meta")
    if kind == "none":
        return None
    if kind == "text":
        return value["value"]
    if kind == "dict":
        return {k: decode(v) for k, v in value["items"]}
    if kind in ("list", "tuple"):
        items = [decode(v) for v in value["items"]]
        return items if kind == "list" else tuple(items)
    return type(value["type"], (), {"__repr__": lambda self: f"<{type(self).__name__} object>"})()




def error_problem(error: Any) -> str | None:
    """What is wrong with an error handed out as :func:`error_data` writes it, if anything."""
    if not (isinstance(error, dict) and set(error) == {"type", "message"} and is_name(error["type"])
            and isinstance(error["message"], str) and len(error["message"]) <= MAX_MESSAGE):
        return "an error without a type name and a message"
    return None


def error_data(exc: BaseException) -> dict:
    """An exception as plain data: ``{"type": its class's name, "message": its text, cut short}``."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        message = ""
    return {"type": type(exc).__name__, "message": message[:MAX_MESSAGE]}


def error_of(kind: str, message: str) -> Exception:
    """An exception whose type is named ``kind`` (a subclass of the builtin of that name where there is one)
    and whose text is ``message``: an error handed out as plain data, raised again (the grader's replay, and
    a check that judges a trace of plain data)."""
    import builtins

    base = getattr(builtins, kind, None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    try:
        return type(kind, (base,), {"__str__": lambda self: message, "__module__": "builtins"})(message)
    except TypeError:  # a builtin whose constructor wants more (UnicodeDecodeError)
        return type(kind, (Exception,), {"__str__": lambda self: message})(message)
