"""The KV cache path of notebook 09's ``TransformerBlock`` and ``TinyGPT``, as a trace of plain data.

Fed in pieces with ``use_cache=True`` after a reset, the block and the model must give the outputs of the
whole input, and again after ``reset_cache()``; a failure says which piece differs and, from the student's
own module, why (the cache never filled, the piece read as a new sequence, positions that restart at 0).

What the check reads of the student's module is one :func:`cached_trace`: plain lists of tensors, numbers
and texts (never an object of the student's), made where the module is (the student's kernel), then judged
by :func:`check_cached_path` against the reference's outputs of the whole input. The trace is the outcome of
one step of the block's or the model's spec (``nb09._cached_steps``): in the student's own self-check both run
in the kernel; under the grader the kernel hands the trace out with the plan's other outcomes and the grader
judges it (``nb09._cached_views``, refused unless :func:`trace_has_form`), so the messages are built once, from
the same data, either way.
"""

from __future__ import annotations

import copy
from typing import Callable, Sequence

import torch
import torch.nn as nn

from course_utils.checks import probe as _probe
from course_utils.checks.core import NOT_IMPLEMENTED, Case, CheckFailed, call_student, describe_shape, fail, \
    _hinted, is_stub_data, tensor_difference

__all__ = ["piece_sizes", "cached_trace", "trace_has_form", "check_cached_path"]


def piece_sizes(T: int) -> list[int]:
    """How a ``T``-token input is cut for the cached path: a first piece, one token, then the rest."""
    first = (T + 1) // 2
    return [n for n in (first, 1, T - first - 1) if n > 0]


def _describe_pieces(sizes: Sequence[int]) -> str:
    return " + ".join(str(n) for n in sizes) + " tokens"


def _error_data(exc: BaseException) -> list:
    """``["error", kind, message]``: an error the student's code raised, as plain data. ``kind`` is the type's
    name, except that the kinds the check tells apart by class are named by it (``NotImplementedError``,
    ``TypeError``), so that a message built from the data is the one the exception itself gave."""
    kind = "NotImplementedError" if isinstance(exc, NotImplementedError) else \
        "TypeError" if isinstance(exc, TypeError) else type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a student's exception whose __str__ fails
        message = ""
    return ["error", kind, message[:_probe.MAX_MESSAGE]]


def _run_outcome(exercise: str, model: nn.Module, x: torch.Tensor, sizes: Sequence[int]) -> list:
    """Reset the caches (``model.reset_cache()`` for the model, ``model.att.reset_cache()`` for a block), then feed
    ``x`` (``(b, T, ...)``) in pieces of ``sizes`` tokens with ``use_cache=True``, as plain data: ``["ok", out_1,
    ...]`` (each piece's output tensor, ``(b, n, ...)``), or where it stopped: ``["reset", "missing"]``,
    ``["reset", "error", kind, message]``, ``["call", k, "error", kind, message]`` or ``["call", k,
    "not_tensor", type name]`` (piece ``k``)."""
    owner = model if exercise == "TinyGPT" else getattr(model, "att", None)
    if not callable(getattr(owner, "reset_cache", None)):
        return ["reset", "missing"]
    try:
        owner.reset_cache()
    except Exception as exc:  # noqa: BLE001 - an outcome
        return ["reset", *_error_data(exc)]
    outs, start = ["ok"], 0
    for k, n in enumerate(sizes):
        try:
            with torch.no_grad():
                out = model(x[:, start:start + n].clone(), use_cache=True)
        except Exception as exc:  # noqa: BLE001
            return ["call", k, *_error_data(exc)]
        if not isinstance(out, torch.Tensor):
            return ["call", k, "not_tensor", type(out).__name__]
        outs.append(out.detach())
        start += n
    return outs


def _outs_or_fail(exercise: str, outcome: list, where: str) -> list:
    """The pieces' outputs of a :func:`_run_outcome`, or the check's failure where it stopped (what the reset or
    the ``use_cache=True`` call raised or returned, in words)."""
    if outcome[0] == "reset":
        name = "reset_cache()" if exercise == "TinyGPT" else "self.att.reset_cache()"
        if outcome[1] == "missing":
            fail(exercise, f"{where}: {name} is missing: "
                           + ("write reset_cache(self), which empties every block's cache and sets self.num_cached to 0."
                              if exercise == "TinyGPT" else
                              "self.att must be notebook 08's MultiHeadAttentionKVCache (section 0), or an attention "
                              "with the same forward(x, use_cache=False) and reset_cache()."))
        if is_stub_data(outcome[2], outcome[3]):
            fail(exercise, NOT_IMPLEMENTED)
        fail(exercise, f"{where}: {name} raised {outcome[2]}: {outcome[3]}.")
    if outcome[0] == "call":
        if outcome[2] == "not_tensor":
            fail(exercise, f"{where}: forward(x, use_cache=True) returned {outcome[3]}, not a tensor.")
        kind, message = outcome[3], outcome[4]
        if is_stub_data(kind, message):
            fail(exercise, NOT_IMPLEMENTED)
        if kind == "TypeError":
            if "use_cache" in message:
                fail(exercise, f"{where}: calling forward(x, use_cache=True) raised TypeError: {message}. forward takes "
                               f"use_cache as its second argument, def forward(self, x, use_cache=False), and hands it on"
                               f" ({'to every block; nn.Sequential passes one argument only, so loop over self.blocks' if exercise == 'TinyGPT' else 'to self.att'}).")
            fail(exercise, f"{where}: forward(x, use_cache=True) raised TypeError: {message}.")
        fail(exercise, f"{where}: forward(x, use_cache=True) raised {kind}: {message}.")
    return list(outcome[1:])


def _first_bad_piece(want: torch.Tensor, outs: list, sizes: Sequence[int]) -> tuple[int, int, str] | None:
    """The first piece whose outputs differ from ``want``'s positions: (piece, start, problem)."""
    start = 0
    for k, (n, out) in enumerate(zip(sizes, outs)):
        problem = tensor_difference(want[:, start:start + n], out)
        if problem:
            return k, start, problem
        start += n
    return None


def _value_outcome(call: Callable[[], object]) -> list:
    """``["ok", value]`` (what ``call()`` returned, a tensor detached) or ``["error", kind, message]``."""
    try:
        with torch.no_grad():
            value = call()
    except Exception as exc:  # noqa: BLE001
        return _error_data(exc)
    return ["ok", value.detach() if isinstance(value, torch.Tensor) else value]


def cached_trace(exercise: str, model: nn.Module, x: torch.Tensor) -> list:
    """What :func:`check_cached_path` reads of ``model`` (the block or the model, test weights loaded) fed ``x``
    (``(b, T, d_model)`` or ids ``(b, T)``) in pieces with ``use_cache=True``, as plain data (under the grader the
    kernel hands it out, a step's outcome, and the check judges it outside): ``[first, num_cached, whole,
    again, end, hints]``:

    - ``first``, ``again``: the pieces after a reset, then once more after the whole input
      (:func:`_run_outcome`; ``again`` is ``None`` where the check stops before it);
    - ``num_cached``: ``model.num_cached`` after ``first``; for ``TinyGPT`` whose ``whole`` ran, ``[after first,
      after one more uncached call of one token]`` (an uncached call leaves it as it is); ``None`` for a block;
    - ``whole``: ``forward(x)`` without the cache after ``first`` (:func:`_value_outcome`);
    - ``end``: ``TinyGPT`` whose ``num_cached`` is not ``None`` after ``again``: ``[reset, num_cached]``, the
      outcome of one more ``reset_cache()`` (``["ok"]`` or as :func:`_run_outcome`'s) and ``num_cached`` then;
    - ``hints``: what :func:`_hints_outcome` reads, on a copy of the model as ``first`` left it, to say why a
      piece after the first differs (the check reads it only then, and stops there); ``None`` for one piece.

    The check reads it in its own order, stopping at the first failure; a part it does not reach decides
    nothing.
    """
    model.eval()
    sizes = piece_sizes(x.shape[1])
    first = _run_outcome(exercise, model, x, sizes)
    if first[0] != "ok":
        return [first, None, None, None, None, None]
    hints = _hints_outcome(exercise, model, x, sizes) if len(sizes) > 1 else None
    cached = getattr(model, "num_cached", None) if exercise == "TinyGPT" else None
    whole = _value_outcome(lambda: model(x.clone()))
    if exercise == "TinyGPT" and whole[0] == "ok":  # an uncached call (of one token) must leave the count as it is
        cached = [cached, getattr(model, "num_cached", None) if _value_outcome(lambda: model(x[:, :1].clone()))[0] == "ok"
                  else cached]
    again = _run_outcome(exercise, model, x, sizes) if whole[0] == "ok" else None
    end = None
    if exercise == "TinyGPT" and again is not None and again[0] == "ok" and \
            getattr(model, "num_cached", None) is not None:
        reset = _run_outcome(exercise, model, x, [])
        end = [reset, getattr(model, "num_cached", None) if reset[0] == "ok" else None]
    return [first, cached, whole, again, end, hints]


def _hints_outcome(exercise: str, model: nn.Module, x: torch.Tensor, sizes: Sequence[int]) -> list | None:
    """What :func:`_cached_hint` reads of ``model`` to say why a piece after the first is wrong, on one copy of
    it (the model as the cached pieces left it): ``[empty, alones, again, blind_whole, blind_again]``:

    - ``empty``: ``["ok", True]`` when every attention's ``cache_k`` is still ``None`` (then nothing else is
      read), ``["ok", False]``, or ``["error", kind, message]`` when looking raised;
    - ``alones``: each piece ``k`` after the first read without the cache, a tensor (``(b, n, ...)``), or
      ``None`` where it raised or gave no tensor;
    - ``again``: where one of those is a tensor, the pieces once more (:func:`_run_outcome`), else ``None``;
    - ``blind_whole``, ``blind_again`` (``TinyGPT`` whose ``pos_emb`` is a module; else ``None``): the copy
      with every tensor of ``pos_emb`` zeroed, read whole (:func:`_value_outcome`) and in pieces.

    One copy serves every piece's hint (a forward pass without the cache leaves the cache as it is, which the
    check asks of every module). ``None`` where the model cannot be copied: then no hint is given."""
    try:
        model = copy.deepcopy(model)
    except Exception:  # noqa: BLE001 - no hint from a module that cannot be copied
        return None
    try:
        attentions = [block.att for block in getattr(model, "blocks", [])] if exercise == "TinyGPT" else [
            getattr(model, "att", None)]
        empty = ["ok", bool(attentions and all(hasattr(att, "cache_k") and att.cache_k is None for att in attentions))]
    except Exception as exc:  # noqa: BLE001 - the check raises it, as it would have
        return [_error_data(exc), None, None, None, None]
    if empty[1]:
        return [empty, None, None, None, None]
    alones = []
    for k in range(1, len(sizes)):
        start = sum(sizes[:k])
        alone = _value_outcome(lambda: model(x[:, start:start + sizes[k]].clone()))
        alones.append(alone[1] if alone[0] == "ok" and isinstance(alone[1], torch.Tensor) else None)
    again = _run_outcome(exercise, model, x, sizes) if any(a is not None for a in alones) else None
    if not (exercise == "TinyGPT" and isinstance(getattr(model, "pos_emb", None), nn.Module)):
        return [empty, alones, again, None, None]

    def blind_whole() -> object:
        for tensor in list(model.pos_emb.parameters()) + list(model.pos_emb.buffers()):
            tensor.zero_()  # no positions at all: only their offset can differ now
        return model(x.clone())

    whole = _value_outcome(blind_whole)
    return [empty, alones, again, whole, _run_outcome(exercise, model, x, sizes) if whole[0] == "ok" else None]


def _raised(outcome: list) -> BaseException:
    """The error of an ``["error", kind, message]`` outcome, to raise again."""
    return _probe.error_of(outcome[1], outcome[2])


def _is_run(value: object, n: int) -> bool:
    """Whether ``value`` has the form of a :func:`_run_outcome` of ``n`` pieces."""
    def error(rest: list) -> bool:
        return len(rest) == 3 and rest[0] == "error" and isinstance(rest[1], str) and isinstance(rest[2], str)

    if not (isinstance(value, list) and value and isinstance(value[0], str)):
        return False
    if value[0] == "ok":
        return len(value) == n + 1 and all(isinstance(v, torch.Tensor) for v in value[1:])
    if value[0] == "reset":
        return value[1:] == ["missing"] or error(value[1:])
    if value[0] == "call" and len(value) >= 2 and type(value[1]) is int and 0 <= value[1] < n:
        rest = value[2:]
        return error(rest) or (len(rest) == 2 and rest[0] == "not_tensor" and isinstance(rest[1], str))
    return False


def _is_value(value: object) -> bool:
    """Whether ``value`` has the form of a :func:`_value_outcome`."""
    return isinstance(value, list) and ((len(value) == 2 and value[0] == "ok") or (
        len(value) == 3 and value[0] == "error" and isinstance(value[1], str) and isinstance(value[2], str)))


def trace_has_form(found: object, n: int) -> bool:
    """Whether ``found`` (handed out, untrusted) has the form of a :func:`cached_trace` of ``n`` pieces: what the
    check reads of it is there, of the types it reads (tensors, whole numbers, names and messages)."""
    def hint(h: object) -> bool:
        if h is None:
            return True
        if not (isinstance(h, list) and len(h) == 5 and _is_value(h[0])):
            return False
        empty, alones, again, whole, blind = h
        if empty[0] == "error" or empty[1] is True:
            return True  # nothing else is read
        return empty[1] is False and isinstance(alones, list) and len(alones) == n - 1 and \
            all(a is None or isinstance(a, torch.Tensor) for a in alones) and \
            (all(a is None for a in alones) or _is_run(again, n)) and \
            (whole is None or (_is_value(whole) and (whole[0] == "error" or _is_run(blind, n))))

    def rest(first: list, cached: object, whole: object, again: object, end: object) -> bool:
        if first[0] != "ok":
            return True  # the check stops at the first pieces: nothing else is read
        return _is_value(whole) and (whole[0] == "error" or _is_run(again, n)) and \
            (end is None or (isinstance(end, list) and len(end) == 2 and _is_run(end[0], 0)))

    return isinstance(found, list) and len(found) == 6 and _is_run(found[0], n) and rest(*found[:5]) and \
        hint(found[5])


def check_cached_path(exercise: str, trace: list, x: torch.Tensor, want: torch.Tensor, where: str) -> None:
    """Fed in pieces with ``use_cache=True`` after a reset, the module must give ``want``, the expected outputs
    of the whole input; again after another reset; and ``forward(x)`` must still read a whole sequence. Judged on
    ``trace``, what :func:`cached_trace` read of the student's module (in the kernel, or handed out)."""
    sizes = piece_sizes(x.shape[1])
    label = f"{where}, input {describe_shape(x)} fed in pieces of {_describe_pieces(sizes)} with use_cache=True"
    first, cached, whole, again, end, hints = trace
    outs = _outs_or_fail(exercise, first, label)
    bad = _first_bad_piece(want, outs, sizes)
    if bad is not None:
        k, start, problem = bad
        n = sizes[k]
        positions = f"position {start}" if n == 1 else f"positions {start}..{start + n - 1}"
        message = (f"{label}: piece {k + 1} ({positions}, read after {start} cached tokens) differs from the whole "
                   f"input's outputs: {problem}")
        fail(exercise, message.rstrip(".") + ". " + _cached_hint(exercise, hints, sizes, k, start))
    if exercise == "TinyGPT":
        counted, after_whole = cached if isinstance(cached, list) and len(cached) == 2 else (cached, None)
        if counted != x.shape[1]:
            fail(exercise, f"{label}: afterwards model.num_cached is {counted!r}, expected {x.shape[1]}: set "
                           f"self.num_cached = start + T at the end of every use_cache=True call.")
        if whole[0] == "ok" and isinstance(cached, list) and after_whole != counted:
            fail(exercise, f"{label}: then forward(x) and forward(x[:, :1]) without use_cache changed model.num_cached "
                           f"from {counted!r} to {after_whole!r}: a call without use_cache leaves the cache and its count "
                           f"as they are (the next cached call goes on at position {counted}). Advance "
                           f"self.num_cached only when use_cache=True.")
    if whole[0] == "error":  # what the student's forward(x) raised, as the check says it

        def whole_again(_: torch.Tensor) -> None:
            raise _raised(whole)
        try:
            call_student(exercise, whole_again, Case("the whole input, after the cached pieces", (x.clone(),)))
        except CheckFailed as error:  # issue 36: the cause, named
            raise _hinted(error, "forward(x) without use_cache raised after cached calls: without use_cache, read x "
                                 "as a whole sequence from position 0 (the cached position is the start only when "
                                 "use_cache=True) and leave the cache alone.") from None
    problem = tensor_difference(want, whole[1])
    if problem:
        fail(exercise, f"{where}: after the cached pieces, forward(x) (use_cache=False) no longer gives the whole "
                       f"input's outputs: {problem} Without use_cache, read x as a whole sequence from position 0 "
                       f"and leave the cache alone.")
    reset_hint = ("reset_cache() must empty every cache" + (" and set self.num_cached back to 0." if exercise == "TinyGPT"
                                                             else "."))
    reset = "reset_cache()" if exercise == "TinyGPT" else "self.att.reset_cache()"
    try:
        again = _outs_or_fail(exercise, again, label)
    except CheckFailed:
        fail(exercise, f"{label}: the first time the outputs were right, but after {reset} the same pieces raise an "
                       f"error (the positions run past context_length, or a cache is still full): {reset_hint}")
    if _first_bad_piece(want, again, sizes) is not None:
        fail(exercise, f"{label}: the first time the outputs were right, but after {reset} the same pieces give other "
                       f"outputs: {reset_hint}")
    if exercise == "TinyGPT" and end is not None:
        _outs_or_fail(exercise, end[0], label)
        if end[1] != 0:
            fail(exercise, f"{label}: after reset_cache(), model.num_cached is {end[1]!r}: set it back to 0.")


def _cached_hint(exercise: str, hints: list | None, sizes: Sequence[int], k: int, start: int) -> str:
    """Why piece ``k`` of the cached path is wrong, from what :func:`_hints_outcome` read of the student's own
    model (answer-free)."""
    if k == 0:
        return ("With an empty cache, forward(x, use_cache=True) must give the same outputs as forward(x): the "
                "cache only changes what LATER calls see.")
    if hints is None:
        return ""
    empty, alones, again, blind_whole, blind_again = hints
    if empty[0] == "error":
        raise _raised(empty)
    if empty[1]:
        return ("After the use_cache=True calls every attention's cache is still empty (cache_k is None): the cache is "
                "not used. " + ("Pass use_cache on to every block (nn.Sequential passes one argument only: for block "
                                "in self.blocks: x = block(x, use_cache=use_cache))." if exercise == "TinyGPT" else
                                "Hand use_cache on to the attention: self.att(self.norm1(x), use_cache=use_cache)."))
    alone = alones[k - 1]
    if isinstance(alone, torch.Tensor) and tensor_difference(alone, _outs_or_fail(exercise, again, "")[k]) is None:
        if exercise == "TinyGPT":
            return ("These outputs are those of the piece read as a new sequence: the cache is not used. Pass "
                    "use_cache on to every block (nn.Sequential passes one argument only: for block in "
                    "self.blocks: x = block(x, use_cache=use_cache)), and start the positions at self.num_cached.")
        return ("These outputs are those of the piece read as a new sequence: the cache is not used. Hand use_cache "
                "on to the attention: self.att(self.norm1(x), use_cache=use_cache).")
    if exercise == "TinyGPT" and blind_whole is not None:
        if blind_whole[0] == "error":
            raise _raised(blind_whole)
        outs = _outs_or_fail(exercise, blind_again, "")
        if _first_bad_piece(blind_whole[1], outs, sizes) is None:
            return (f"Without position vectors the pieces agree, so the positions are wrong: the tokens of a "
                    f"use_cache=True call continue the sequence, so their positions start at the number of tokens "
                    f"already cached ({start} here): self.pos_emb(..., start=self.num_cached), and "
                    f"self.num_cached grows by T after each call.")
    return ""
