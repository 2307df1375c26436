"""Self-checks for notebook 11 (serving): a paged KV cache and paged attention, each declared as a spec
(:mod:`course_utils.checks.spec`).

``PagedKVCache`` is a stateful object: each of its cases is a **session**, a list of operations
(``allocate``, ``append``, ``gather``, ``block_table``, ``free``, ``num_free_blocks``, the pool itself) run in
order on one cache by the runner :func:`run_session`, which returns what each operation gave as plain data.
The judge runs the same session on the reference (``expected.expect``: live, or recorded in the student
edition) and compares operation by operation; the first difference is the message, with a hint read from
the symptom (a token at a block boundary, a freed sequence's blocks, two sequences in one block).

``paged_attention`` is a function: each case is one call, compared with the reference's output; a wrong
output that matches a known mistake (``course_utils.instructor.nb11``) is named by it.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from course_utils.checks import core
from course_utils.checks.core import Case
from course_utils.checks.spec import Outcomes, Spec, Step, declare, function_spec, refuse, with_hidden

__all__ = ["check_PagedKVCache", "check_paged_attention", "check_speculative_generate", "check_ContinuousBatcher"]


# --------------------------------------------------------------------------------------------
# PagedKVCache: sessions of operations
# --------------------------------------------------------------------------------------------
def kv(num_kv_heads: int, tokens: int, head_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``tokens`` new tokens, each ``(num_kv_heads, tokens, head_dim)``, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(num_kv_heads, tokens, head_dim, generator=g),
            torch.randn(num_kv_heads, tokens, head_dim, generator=g))


def session(name: str, build: tuple[int, int, int, int], ops: Sequence[tuple]) -> Case:
    """A case of ``PagedKVCache``: the constructor's ``(num_blocks, block_size, num_kv_heads, head_dim)``
    and the operations run in order, each a tuple: ``("allocate", s)``, ``("append", s, k, v)``,
    ``("gather", s)``, ``("block_table", s)``, ``("free", s)``, ``("num_free_blocks",)``, ``("pool",)``."""
    if len(ops) > 60:
        raise ValueError(f"a session has at most 60 operations (the hand-off's lists hold 64), got {len(ops)}")
    return Case(name, (tuple(build), tuple(tuple(op) for op in ops)))


def appended(s: int, seed: int, tokens: int, num_kv_heads: int, head_dim: int) -> tuple:
    """The operation ``("append", s, k, v)`` with ``tokens`` new tokens drawn from ``seed``."""
    return ("append", s, *kv(num_kv_heads, tokens, head_dim, seed))


def run_session(cache_class: Any, case: Case) -> list:
    """Run ``case``'s session on a new ``cache_class(*build)``: ``[pool shapes, outcome of each operation]``.

    The pool shapes are ``[key_blocks' shape, value_blocks' shape]``; each operation's outcome is
    ``["ok", value]`` (``value``: ``(k, v)`` for ``gather``, a list of ints for ``block_table``, an int for
    ``num_free_blocks``, ``(key_blocks, value_blocks)`` for ``pool``, ``None`` otherwise) or ``["error",
    type name, message]``. The session goes on after an error, as a server would."""
    build, ops = case.args
    torch.manual_seed(core.BUILD_SEED)
    cache = cache_class(*build)
    found: list = [[list(cache.key_blocks.shape), list(cache.value_blocks.shape)]]
    for op in ops:
        name, args = op[0], op[1:]
        try:
            if name == "gather":
                k, v = cache.gather(*args)
                value: Any = (k.detach().clone(), v.detach().clone())
            elif name == "block_table":
                value = [int(b) for b in cache.block_table(*args)]
            elif name == "num_free_blocks":
                count = cache.num_free_blocks
                value = int(count() if callable(count) else count)
            elif name == "pool":
                value = (cache.key_blocks.detach().clone(), cache.value_blocks.detach().clone())
            else:
                getattr(cache, name)(*args)
                value = None
            found.append(["ok", value])
        except Exception as exc:  # noqa: BLE001 - an error is an outcome, and the session goes on
            found.append(["error", type(exc).__name__, str(exc)[:300]])
    return found


def _describe(op: tuple) -> str:
    name, args = op[0], op[1:]
    if name == "append":
        return f"append({args[0]}, k, v) of {args[1].shape[1]} tokens"
    if name in ("num_free_blocks", "pool"):
        return "num_free_blocks" if name == "num_free_blocks" else "the pool (key_blocks, value_blocks)"
    return f"{name}({args[0]})"


def _well_formed(exercise: str, got: Any, ops: Sequence[tuple]) -> None:
    """Refuse a session's outcome that no run of :func:`run_session` gives (a forged hand-off)."""
    if not (isinstance(got, list) and len(got) <= len(ops) + 1 and got and isinstance(got[0], list)):
        refuse(exercise, "session")
    for item in got[1:]:
        if not (isinstance(item, list) and item and item[0] in ("ok", "error")
                and (len(item) == 2 if item[0] == "ok" else len(item) == 3 and all(isinstance(x, str) for x in item[1:]))):
            refuse(exercise, "session")


def _lengths_before(ops: Sequence[tuple], index: int) -> dict[int, int]:
    """How many tokens each live sequence holds before operation ``index`` (as the reference runs it)."""
    lengths: dict[int, int] = {}
    for op in ops[:index]:
        if op[0] == "allocate":
            lengths[op[1]] = 0
        elif op[0] == "append" and op[1] in lengths:
            lengths[op[1]] += op[2].shape[1]
        elif op[0] == "free":
            lengths.pop(op[1], None)
    return lengths


BOUNDARY_HINT = ("check the block boundaries: token t of a sequence goes to block table[t // block_size], slot "
                 "t % block_size, and a new block is taken exactly when the length reaches a multiple of block_size "
                 "(an off-by-one there overwrites a slot or skips one)")
FREED_HINT = ("after free(seq_id) the sequence's blocks go back to the free list and the sequence is forgotten: "
              "a freed block must not stay listed (in its table, or twice in the free list)")
SHARED_HINT = ("two sequences hold the same block: each block belongs to one sequence at a time, so take a block "
               "off the free list when you hand it out")
OUT_OF_BLOCKS_HINT = ("when the free list is too short, append must raise an error that names the sequence and how "
                      "many blocks it needed, and change nothing (check before taking any block)")


def _session_hint(ops: Sequence[tuple], index: int, got: list, want_all: list, build: tuple) -> str | None:
    """The likely mistake behind the first difference, at operation ``index`` (0-based in ``ops``): ``got`` and
    ``want_all`` are the student's and the reference's whole sessions."""
    want = want_all[index + 1]
    block_size = build[1]
    tables = {}  # seq_id -> its table as the student's session showed it last
    for op, outcome in zip(ops[: index + 1], got[1: index + 2]):
        if op[0] == "block_table" and outcome[0] == "ok":
            tables[op[1]] = outcome[1]
        if op[0] == "free":
            tables.pop(op[1], None)
    owners: dict[int, int] = {}
    for seq, table in tables.items():
        for block in table:
            if block in owners and owners[block] != seq:
                return SHARED_HINT
            owners[block] = seq
    op = ops[index]
    freed_before = any(o[0] == "free" for o in ops[:index])
    failed_before = any(o[0] == "append" and w[0] == "error" for o, w in zip(ops[:index], want_all[1:index + 1]))
    if op[0] == "block_table" and want[0] == "error" and freed_before:
        return FREED_HINT
    if op[0] == "append" and want[0] == "error":
        return OUT_OF_BLOCKS_HINT
    mine = got[index + 1]
    if op[0] == "num_free_blocks" and mine[0] == "ok" and want[0] == "ok" and isinstance(mine[1], int):
        if mine[1] > want[1]:
            return "blocks you handed out are still counted as free: " + SHARED_HINT
        return OUT_OF_BLOCKS_HINT if failed_before else FREED_HINT if freed_before else BOUNDARY_HINT
    if failed_before:
        return OUT_OF_BLOCKS_HINT
    lengths = _lengths_before(ops, index)
    if op[0] == "gather" and op[1] in lengths and lengths[op[1]] > block_size:
        other_writes = [o for o in ops[:index] if o[0] == "append" and o[1] != op[1]]
        return SHARED_HINT if _shared_symptom(got, want, index, ops) else BOUNDARY_HINT if not other_writes \
            else f"{BOUNDARY_HINT}; or {SHARED_HINT}"
    if op[0] == "append" and got[index + 1][0] == "error" and op[1] in lengths:
        start, new = lengths[op[1]], op[2].shape[1]
        if (start + new - 1) // block_size != start // block_size or start % block_size == 0:
            return BOUNDARY_HINT
    return None


def _shared_symptom(got: list, want: list, index: int, ops: Sequence[tuple]) -> bool:
    """Whether a wrong ``gather`` holds keys that another sequence appended (its block was shared)."""
    outcome = got[index + 1]
    if outcome[0] != "ok" or not isinstance(outcome[1], tuple) or not isinstance(outcome[1][0], torch.Tensor):
        return False
    k = outcome[1][0]
    others = [o[2] for o in ops[:index] if o[0] == "append" and o[1] != ops[index][1]]
    for other in others:
        for t in range(other.shape[1]):
            column = other[:, t]  # (num_kv_heads, head_dim)
            if k.dim() == 3 and k.shape[0] == column.shape[0] and k.shape[2] == column.shape[1] \
                    and any(torch.equal(k[:, i], column) for i in range(k.shape[1])):
                return True
    return False


def _same_value(want: Any, got: Any) -> str | None:
    if isinstance(want, tuple):
        if not (isinstance(got, (tuple, list)) and len(got) == len(want)):
            return f"it returned {core.describe_shape(got)}, not a pair (k, v) of tensors"
        for name, w, g in zip(("k", "v"), want, got):
            problem = core.tensor_difference(w, g)
            if problem:
                return f"{name}: {problem}"
        return None
    if want != got:
        return f"it gave {got!r}, expected {want!r}"
    return None


def live_slots(cache_class: Any, case: Case) -> list[torch.Tensor]:
    """For each ``("pool",)`` operation of ``case``'s session, run on ``cache_class`` (the reference): the
    ``(num_blocks, block_size)`` bool of the slots that hold a live sequence's token at that moment."""
    build, ops = case.args
    cache = cache_class(*build)
    found = []
    for index, op in enumerate(ops):
        if op[0] == "pool":
            live = torch.zeros(build[0], build[1], dtype=torch.bool)
            for seq in _lengths_before(ops, index):
                table = cache.block_table(seq)
                for t in range(cache.gather(seq)[0].shape[1]):
                    live[table[t // build[1]], t % build[1]] = True
            found.append(live)
            continue
        try:
            getattr(cache, op[0])(*op[1:]) if op[0] not in ("num_free_blocks",) else None
        except Exception:  # noqa: BLE001 - the reference's expected errors (out of blocks, a freed sequence)
            pass
    return found


def _judge_sessions(plan: list[Step], outcomes: Outcomes) -> str:
    exercise = "PagedKVCache"
    from course_utils.checks import expected

    for step in plan:
        case = step.case
        build, ops = case.args
        got = outcomes[step.key]
        if isinstance(got, BaseException):
            failed = core.CheckFailed(f"❌ {exercise} on case '{case.name}': building {exercise}{tuple(build)} or "
                                      f"reading its key_blocks and value_blocks raised {type(got).__name__}: {got}")
            if core.is_stub_error(got):
                failed = core.CheckFailed(f"❌ {exercise}: {core.NOT_IMPLEMENTED}")
            raise failed
        _well_formed(exercise, got, ops)
        want = expected.expect(exercise, case.key(), lambda: run_session(expected.reference(exercise), case))
        num_blocks, block_size, num_kv_heads, head_dim = build
        shape = [num_blocks, num_kv_heads, block_size, head_dim]
        if got[0] != [shape, shape]:
            core.fail(exercise, f"key_blocks and value_blocks must each be (num_blocks, num_kv_heads, block_size, "
                                f"head_dim) = {tuple(shape)}; yours are {got[0]}", case)
        if len(got) != len(want):
            refuse(exercise, "session")
        lives = iter(expected.expect(exercise, f"live slots: {case.key()}",
                                     lambda: live_slots(expected.reference(exercise), case)))
        for index, (op, g, w) in enumerate(zip(ops, got[1:], want[1:])):
            where = f"operation {index + 1}, {_describe(op)}"
            problem = None
            if w[0] == "error" and g[0] == "ok":
                problem = f"it should raise an error ({w[1]}: {w[2]}), but it ran"
            elif w[0] == "ok" and g[0] == "error":
                problem = f"it raised {g[1]}: {g[2]}"
            elif w[0] == "error":
                if op[0] == "append":
                    needed = w[2].split(" needs ")[1].split(" ")[0]
                    if str(op[1]) not in g[2] or needed not in g[2]:
                        problem = (f"the error must name the sequence ({op[1]}) and the {needed} blocks it needed; "
                                   f"yours says: {g[1]}: {g[2]}")
                elif g[1] != w[1]:
                    problem = f"it should raise {w[1]}, not {g[1]}: {g[2]}"
            elif op[0] == "pool":
                live = next(lives)
                if not (isinstance(g[1], tuple) and len(g[1]) == 2 and all(isinstance(t, torch.Tensor) for t in g[1])):
                    refuse(exercise, "pool")
                for name, w_pool, g_pool in zip(("key_blocks", "value_blocks"), w[1], g[1]):
                    if g_pool.shape != w_pool.shape or not torch.allclose(g_pool.transpose(1, 2)[live], w_pool.transpose(1, 2)[live], atol=1e-6):
                        problem = (f"{name} does not hold each token at block table[t // block_size], slot "
                                   f"t % block_size, where paged attention will read it")
                        break
            else:
                problem = _same_value(w[1], g[1])
            if problem:
                hint = _session_hint(ops, index, got, want, build)
                message = f"{where}: {problem}" + (f". Hint: {hint}" if hint else "")
                core.fail(exercise, message, case)
    return f"{len(plan)} sessions of allocate, append, gather, block_table and free agree with the reference " \
           f"({'; '.join(s.case.name for s in plan)})"


def _visible_sessions() -> list[Case]:
    a = lambda s, seed, n: appended(s, seed, n, 2, 3)  # noqa: E731 - (2 kv heads, head_dim 3)
    one = session("one sequence, block_size 4: 3, then 6, then 1 tokens", (4, 4, 2, 3), [
        ("allocate", 0), ("block_table", 0), a(0, 1101, 3), ("block_table", 0), ("gather", 0),
        a(0, 1102, 6), ("block_table", 0), ("gather", 0), a(0, 1103, 1), ("gather", 0), ("num_free_blocks",),
        ("pool",), ("free", 0), ("num_free_blocks",), ("block_table", 0)])
    two = session("two sequences taking turns, block_size 2; one freed, its blocks reused", (6, 2, 2, 3), [
        ("allocate", 1), ("allocate", 2), a(1, 1111, 3), a(2, 1112, 2), a(1, 1113, 1), a(2, 1114, 3),
        ("block_table", 1), ("block_table", 2), ("gather", 1), ("gather", 2), ("pool",), ("free", 1),
        ("num_free_blocks",), ("allocate", 3), a(3, 1115, 4), ("block_table", 3), ("block_table", 2),
        ("gather", 2), ("gather", 3), ("pool",), ("num_free_blocks",)])
    out = session("out of blocks: 3 blocks of 2, a second sequence wants 2 of them", (3, 2, 2, 3), [
        ("allocate", 5), a(5, 1121, 3), ("allocate", 6), a(6, 1122, 3), ("num_free_blocks",), ("gather", 6),
        ("block_table", 6), a(6, 1123, 2), ("block_table", 6), ("gather", 6), ("gather", 5), ("num_free_blocks",)])
    return [one, two, out]


check_PagedKVCache = declare(
    Spec("PagedKVCache",
         lambda hidden: [Step(c.key(), c, "session") for c in with_hidden("PagedKVCache", _visible_sessions)(hidden)],
         _judge_sessions, runners={"session": run_session}),
    """Run sessions of ``allocate``, ``append``, ``gather``, ``block_table``, ``free`` and ``num_free_blocks`` on
    your ``PagedKVCache`` and on ours: the same results after every operation, the tokens in the pool where the
    block tables say, and a clear error when the blocks run out.""")


# --------------------------------------------------------------------------------------------
# paged_attention: a ragged batch read from the blocks
# --------------------------------------------------------------------------------------------
def paged_case(name: str, seq_lens: Sequence[int], num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, seed: int, *, nan: bool = False, spare_columns: int = 0,
               dtype: torch.dtype = torch.float32) -> Case:
    """A decode step of ``len(seq_lens)`` sequences whose blocks are scattered over a pool (block 0 and the
    last block belong to no sequence). Slots no sequence holds (free blocks, a last block's tail) hold
    random numbers, or inf with ``nan=True`` (garbage that poisons any sum it enters). ``spare_columns``: more -1 padding on every row."""
    g = torch.Generator().manual_seed(seed)
    needs = [-(-n // block_size) for n in seq_lens]
    num_blocks = sum(needs) + 2
    order = (torch.randperm(num_blocks - 2, generator=g) + 1).tolist()  # blocks 1 .. num_blocks-2, shuffled
    width = max(needs) + spare_columns
    tables = torch.full((len(seq_lens), width), -1, dtype=torch.int64)
    shape = (num_blocks, num_kv_heads, block_size, head_dim)
    keys, values = torch.randn(shape, generator=g, dtype=dtype), torch.randn(shape, generator=g, dtype=dtype)
    live = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    for i, (n, need) in enumerate(zip(seq_lens, needs)):
        blocks = [order.pop() for _ in range(need)]
        tables[i, :need] = torch.tensor(blocks)
        for t in range(n):
            live[blocks[t // block_size], t % block_size] = True
    if nan:  # inf, not NaN: the check's test for an input changed in place tells inf from inf, not NaN from NaN
        keys[~live[:, None, :, None].expand(shape)] = float("inf")
        values[~live[:, None, :, None].expand(shape)] = float("inf")
    q = torch.randn(len(seq_lens), num_heads, head_dim, generator=g, dtype=dtype)
    return Case(name, (q, keys, values, tables, torch.tensor(list(seq_lens), dtype=torch.int64)))


NAN_HINT = ("your output holds NaN or inf. In this case the slots that belong to no sequence (free blocks, and a "
            "last block's slots past seq_lens) hold inf, as unwritten memory may hold anything: read only each "
            "sequence's own blocks (block_tables[i, :number of its blocks], never a -1) and its first seq_lens[i] "
            "slots. A score masked to -inf does not help: its weight 0 times an inf value is NaN.")


def _paged_diagnose(case: Case, got: object, want: object) -> str | None:
    if isinstance(got, torch.Tensor) and got.is_floating_point() and not torch.isfinite(got).all() \
            and torch.isinf(case.args[1]).any():
        return NAN_HINT
    if isinstance(got, IndexError) or (isinstance(got, BaseException) and "index -1" in str(got)):
        return "a -1 in block_tables is padding, not a block: read only a sequence's first ceil(seq_len / block_size) entries."
    return None


def _paged_cases() -> list[Case]:
    return [
        paged_case("3 sequences of 5, 1 and 8 tokens, 2 heads, block_size 4", (5, 1, 8), 2, 2, 4, 4, seed=1131),
        paged_case("GQA: 4 query heads share 2 kv heads, block_size 3, lengths 7, 2, 3, 9", (7, 2, 3, 9), 4, 2, 5, 3,
                   seed=1132),
        paged_case("free slots hold inf: 6 query heads, 2 kv heads, block_size 4, lengths 6, 9, 1", (6, 9, 1), 6, 2, 4,
                   4, seed=1133, nan=True, spare_columns=1),
    ]


check_paged_attention = declare(
    function_spec("paged_attention", _paged_cases, diagnose=_paged_diagnose),
    """Compare ``paged_attention(q, key_blocks, value_blocks, block_tables, seq_lens)`` with the reference on
    ragged batches, grouped-query heads, and a pool whose free slots hold NaN.""")


# --------------------------------------------------------------------------------------------
# speculative_generate: stand-in models, greedy runs compared exactly, sampled runs tested for their law
# --------------------------------------------------------------------------------------------
class StandInLM:
    """A tiny language model with a KV cache of its own, for the checks of ``speculative_generate``: the
    next-token logits at position ``t`` are ``token[x_t] + previous[x_{t-1}] + position[t]`` (tables drawn
    from ``seed``), so they depend on the cache (the token before, the position) as a transformer's do, and
    cost one lookup. Its cache holds the token ids read so far; ``truncate_cache(n)`` keeps the first ``n``.
    ``calls`` counts its forward passes. ``model(idx, use_cache=False)``, ``reset_cache()``, ``num_cached``,
    ``context_length`` and ``eval()`` are those of notebook 09's ``TinyGPT``."""

    def __init__(self, vocab_size: int, context_length: int, seed: int, scale: float = 1.0, noise_seed: int = 0,
                 noise: float = 0.0):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.context_length = vocab_size, context_length
        self.token = scale * torch.randn(vocab_size, vocab_size, generator=g)  # (V, V)
        self.previous = scale * torch.randn(vocab_size + 1, vocab_size, generator=g)  # row V: no token before
        self.position = 0.5 * scale * torch.randn(context_length, vocab_size, generator=g)  # (context, V)
        if noise:  # a draft: the same tables, blurred (it agrees with the target often, not always)
            n = torch.Generator().manual_seed(noise_seed)
            for table in (self.token, self.previous, self.position):
                table += noise * torch.randn(table.shape, generator=n)
        self.calls = 0
        #: Forward passes allowed before the model refuses (a loop that writes no token would never end).
        self.max_calls = 10_000
        self.reset_cache()

    def eval(self) -> "StandInLM":
        return self

    def train(self, mode: bool = True) -> "StandInLM":
        return self

    def reset_cache(self) -> None:
        self.cached = torch.zeros(1, 0, dtype=torch.int64)  # (b, tokens read)
        self.num_cached = 0

    def truncate_cache(self, num_tokens: int) -> None:
        self.cached = self.cached[:, :num_tokens]
        self.num_cached = self.cached.shape[1]

    def __call__(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        return self.forward(idx, use_cache)

    def forward(self, idx: torch.Tensor, use_cache: bool = False) -> torch.Tensor:
        """Logits ``(b, T, V)`` of token ids ``idx`` ``(b, T)``: with ``use_cache``, the NEXT tokens after the
        cached ones."""
        self.calls += 1
        if self.calls > self.max_calls:
            raise RuntimeError(f"the stand-in model was called more than {self.max_calls} times: does a round of "
                               f"your loop write no token?")
        if idx.dim() != 2:
            raise ValueError(f"the stand-in model reads token ids (b, T), got {tuple(idx.shape)}")
        if idx.shape[1] == 0:
            raise ValueError(f"the stand-in model got no new token (input {tuple(idx.shape)}) while its cache holds "
                             f"{self.num_cached} tokens: a cache that is not cut back after a rejection holds more "
                             f"tokens than the sequence")
        history = self.cached if use_cache and self.num_cached else idx[:, :0]
        if history.shape[0] not in (0, idx.shape[0]) and self.num_cached:
            raise ValueError(f"the stand-in's cache holds {history.shape[0]} sequences, the input {idx.shape[0]}")
        full = torch.cat([history.expand(idx.shape[0], -1), idx.long()], dim=1)  # (b, cached + T)
        if full.shape[1] > self.context_length:
            raise ValueError(f"the stand-in model's cache holds {history.shape[1]} tokens and the input adds "
                             f"{idx.shape[1]}: {full.shape[1]} > context_length={self.context_length}")
        start = history.shape[1]
        before = torch.cat([torch.full_like(full[:, :1], self.vocab_size), full[:, :-1]], dim=1)[:, start:]
        logits = self.token[idx.long()] + self.previous[before] + self.position[start:full.shape[1]]
        if use_cache:
            self.cached, self.num_cached = full, full.shape[1]
        return logits  # (b, T, V)


#: The keys of the stats dict, in the order the runners hand them out.
STATS = ("proposed", "accepted", "target_calls")


def stand_ins(case: Case, calls_per_run: int = 1) -> tuple[StandInLM, StandInLM]:
    """The case's target and draft (``case.args[0]`` and ``[1]``: :class:`StandInLM`'s arguments), each allowed
    ``calls_per_run`` times what writing the case's tokens one at a time takes, plus a margin."""
    target, draft = StandInLM(*case.args[0]), StandInLM(*case.args[1])
    target.max_calls = draft.max_calls = calls_per_run * (4 * case.args[3] + 10)
    return target, draft


def _stats_of(stats: Any) -> list:
    if not isinstance(stats, dict):
        raise TypeError(f"stats must be a dict with the keys {', '.join(STATS)}, got {type(stats).__name__}")
    missing = [name for name in STATS if name not in stats]
    if missing:
        raise KeyError(f"stats has no {', '.join(missing)}: it must have the keys {', '.join(STATS)}")
    return [int(stats[name]) for name in STATS]


def run_greedy(speculative_generate: Any, case: Case) -> list:
    """One call at the case's temperature on fresh stand-ins: ``[tokens, [proposed, accepted, target_calls],
    the target's forward passes counted, the draft's]``."""
    target, draft = stand_ins(case)
    prompt, max_new_tokens, k, temperature = case.args[2:6]
    torch.manual_seed(core.FORWARD_SEED)
    tokens, stats = speculative_generate(target, draft, prompt.clone(), max_new_tokens, k=k, temperature=temperature)
    return [tokens, _stats_of(stats), target.calls, draft.calls]


def run_sampled(speculative_generate: Any, case: Case) -> list:
    """``runs`` calls (seeded once) at the case's temperature: ``[counts (V, V) of the first two new tokens,
    the stats summed, the target's forward passes counted]``."""
    prompt, max_new_tokens, k, temperature, runs, seed = case.args[2:8]
    target, draft = stand_ins(case, runs)
    V = target.vocab_size
    counts = torch.zeros(V, V, dtype=torch.int64)
    total = [0, 0, 0]
    torch.manual_seed(seed)
    for _ in range(runs):
        tokens, stats = speculative_generate(target, draft, prompt.clone(), max_new_tokens, k=k, temperature=temperature)
        T0 = prompt.shape[1]
        if not (isinstance(tokens, torch.Tensor) and tokens.shape == (1, T0 + max_new_tokens)):
            raise ValueError(f"speculative_generate returned {core.describe_shape(tokens)}, not tokens of shape "
                             f"(1, {T0 + max_new_tokens})")
        counts[int(tokens[0, T0]), int(tokens[0, T0 + 1])] += 1
        total = [a + b for a, b in zip(total, _stats_of(stats))]
    return [counts, total, target.calls]


def greedy_case(name: str, target: tuple, draft: tuple, prompt: Sequence[int], max_new_tokens: int, k: int) -> Case:
    """A call at temperature 0 on the stand-ins ``target`` and ``draft`` (:class:`StandInLM`'s arguments)."""
    return Case(name, (tuple(target), tuple(draft), torch.tensor([list(prompt)]), max_new_tokens, k, 0.0))


def sampled_case(name: str, target: tuple, draft: tuple, prompt: Sequence[int], k: int, temperature: float,
                 runs: int, seed: int) -> Case:
    """``runs`` calls writing 3 tokens at ``temperature``, the first two counted."""
    return Case(name, (tuple(target), tuple(draft), torch.tensor([list(prompt)]), 3, k, temperature, runs, seed))


def target_law(case: Case) -> torch.Tensor:
    """``(V, V)`` float64: the target's probability of each pair of first two new tokens at the case's
    temperature (the stand-in's logits, no sampling)."""
    target = StandInLM(*case.args[0])
    prompt, temperature = case.args[2], case.args[5]
    first = torch.softmax(target(prompt)[0, -1].double() / temperature, dim=-1)  # (V,)
    V = target.vocab_size
    law = torch.zeros(V, V, dtype=torch.float64)
    for x in range(V):
        after = torch.cat([prompt, torch.tensor([[x]])], dim=1)
        law[x] = first[x] * torch.softmax(target(after)[0, -1].double() / temperature, dim=-1)
    return law


def first_token_laws(case: Case) -> dict[str, torch.Tensor]:
    """The law of the first new token ``(V,)``: the right one (the target's ``p``) and those two known mistakes
    give, from ``p`` and the draft's ``q`` at the first proposal."""
    target, draft = StandInLM(*case.args[0]), StandInLM(*case.args[1])
    prompt, temperature = case.args[2], case.args[5]
    p = torch.softmax(target(prompt)[0, -1].double() / temperature, dim=-1)
    q = torch.softmax(draft(prompt)[0, -1].double() / temperature, dim=-1)
    residual = (p - q).clamp(min=0)
    residual = residual / residual.sum()
    overlap = torch.minimum(p, q)
    return {
        "right": p,
        ACCEPT_HINT: q * (p >= q) + (q * (p < q)).sum() * residual,
        RESIDUAL_HINT: overlap + (1 - overlap.sum()) * p,
    }


#: A correct implementation fails the test of a sampled case with this probability (its false-alarm rate):
#: the p-value of a chi-square test on the counts of the first two new tokens is below it 1 time in 10,000.
ALPHA = 1e-4

GREEDY_HINT = ("at temperature 0 the output must be the target's greedy output: accept a proposal only when it is "
               "the target's argmax at that position, and at the first rejection write the target's argmax")
BONUS_HINT = ("when all n proposals are accepted, the target's last distribution (after the last proposal) gives one "
              "more token for free: the bonus token. Without it, every round writes one token fewer")
ROLLBACK_HINT = ("the draft's cache was not rolled back after a rejection: cut it back (serving.truncate_cache) to the "
                 "tokens kept, or its next proposals read tokens that were thrown away")
ROUND_HINT = ("each round proposes n = min(k, tokens still to write - 1) tokens, the target reads them in one "
              "forward pass, and stats counts the proposals, the accepted ones and every forward pass of the target")
ACCEPT_HINT = ("accept a proposal d with probability min(1, p(d) / q(d)) (draw u = torch.rand(()) and accept if "
               "u < p(d) / q(d)), not only when p(d) >= q(d)")
RESIDUAL_HINT = ("after a rejection, draw from the residual max(0, p - q), normalised, not from p: the draft's accepted "
                 "tokens already gave p's overlap with q its share")


def _raised(case: Case, error: BaseException) -> core.CheckFailed:
    exercise = "speculative_generate"
    if core.is_stub_error(error):
        return core.CheckFailed(f"❌ {exercise}: {core.NOT_IMPLEMENTED}")
    message = f"❌ {exercise} on case '{case.name}': your code raised {type(error).__name__}: {error}"
    if ("context_length" in str(error) and "cache" in str(error)) or "not cut back" in str(error):
        message += f". Hint: {ROLLBACK_HINT}"
    elif "called more than" in str(error):
        message += f". Hint: {BONUS_HINT}"
    return core.CheckFailed(message)


def _judge_greedy(case: Case, got: list, want: list) -> None:
    from course_utils.checks import expected

    exercise = "speculative_generate"
    tokens, stats, target_calls = got[0], got[1], got[2]
    T0, max_new_tokens = case.args[2].shape[1], case.args[3]
    if not isinstance(tokens, torch.Tensor) or tokens.shape != (1, T0 + max_new_tokens):
        core.fail(exercise, f"tokens must be (1, T0 + max_new_tokens) = (1, {T0 + max_new_tokens}), as generate "
                            f"returns; yours is {core.describe_shape(tokens)}", case)
    greedy = expected.expect(exercise, f"greedy generate: {case.key()}", lambda: expected.reference("generate")(
        StandInLM(*case.args[0]), case.args[2].clone(), max_new_tokens, temperature=0.0))
    if not torch.equal(tokens.long(), greedy):
        where = int((tokens.long() != greedy).nonzero()[0, 1]) - T0
        core.fail(exercise, f"new token {where} is {int(tokens[0, T0 + where])}, the target's greedy generate writes "
                            f"{int(greedy[0, T0 + where])}. Hint: {GREEDY_HINT}", case)
    if stats[2] != target_calls:
        core.fail(exercise, f"stats['target_calls'] is {stats[2]}, but the target ran {target_calls} forward passes",
                  case)
    if stats != want[1]:
        shown = ", ".join(f"{name} {g} (expected {w})" for name, g, w in zip(STATS, stats, want[1]))
        same_models = tuple(case.args[0]) == tuple(case.args[1])
        hint = BONUS_HINT if same_models and stats[2] > want[1][2] else \
            ROLLBACK_HINT if not same_models and stats[1] < want[1][1] else ROUND_HINT
        core.fail(exercise, f"the right tokens, but stats are off: {shown}. Hint: {hint}", case)


def _judge_sampled(case: Case, got: list) -> None:
    exercise = "speculative_generate"
    counts, stats, target_calls = got
    runs, temperature = case.args[6], case.args[5]
    law = target_law(case)
    if not (isinstance(counts, torch.Tensor) and counts.shape == law.shape and counts.dtype == torch.int64
            and int(counts.sum()) == runs and bool((counts >= 0).all())):
        refuse(exercise, "sampled runs")
    if stats[2] != target_calls:
        core.fail(exercise, f"over {runs} runs, stats['target_calls'] adds up to {stats[2]}, but the target ran "
                            f"{target_calls} forward passes", case)
    expected_counts = runs * law  # (V, V)
    statistic = float(((counts.double() - expected_counts) ** 2 / expected_counts).sum())
    df = law.numel() - 1
    p_value = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                            torch.tensor(statistic / 2, dtype=torch.float64)))
    if p_value >= ALPHA:
        return
    first = counts.sum(dim=1).double()  # (V,): the first new token's counts
    scores = {name: float((first * torch.log(law_.clamp(min=1e-300))).sum())
              for name, law_ in first_token_laws(case).items()}
    best = max(scores, key=scores.get)
    hint = f" Hint: {best}" if best != "right" else (
        " Hint: check the acceptance test (probability min(1, p(d) / q(d))), the residual max(0, p - q) after a "
        "rejection, and that p and q are softmax(logits / temperature)")
    core.fail(exercise, f"over {runs} runs at temperature {temperature}, the first two new tokens do not follow the "
                        f"target's distribution (chi-square test: {statistic:.1f} on {df} degrees of freedom, p-value "
                        f"{p_value:.1e}, under {ALPHA:g}; a correct answer fails this test 1 time in "
                        f"{round(1 / ALPHA):,}).{hint}", case)


def _well_formed_run(exercise: str, step: Step, got: Any) -> None:
    sizes = {"greedy": 4, "sampled": 3}
    if not (isinstance(got, list) and len(got) == sizes[step.run] and isinstance(got[1], list) and len(got[1]) == 3
            and all(type(n) is int for n in got[1]) and type(got[2]) is int):
        refuse(exercise, f"{step.run} run")


def _judge_speculative(plan: list[Step], outcomes: Outcomes) -> str:
    from course_utils.checks import expected

    exercise = "speculative_generate"
    for step in plan:
        got = outcomes[step.key]
        if isinstance(got, BaseException):
            raise _raised(step.case, got)
        _well_formed_run(exercise, step, got)
        if step.run == "greedy":
            want = expected.expect(exercise, step.case.key(),
                                   lambda: run_greedy(expected.reference(exercise), step.case))
            _judge_greedy(step.case, got, want)
        else:
            _judge_sampled(step.case, got)
    greedy = [s for s in plan if s.run == "greedy"]
    sampled = [s for s in plan if s.run == "sampled"]
    return (f"{len(greedy)} greedy runs write the target's greedy tokens with our stats; {len(sampled)} sampled "
            f"cases of {sum(s.case.args[6] for s in sampled):,} runs follow the target's distribution (chi-square "
            f"test, false-alarm rate {ALPHA:g} each)")


#: The stand-ins of the visible cases: a target, a draft that often agrees with it, and one that is it.
_TARGET = (8, 32, 1161, 2.0)
_DRAFT = (8, 32, 1161, 2.0, 1162, 0.5)
#: For the sampled runs: 3 tokens, a flat target (every pair of two tokens has a probability of 0.039 or more,
#: so that each of the 9 cells expects 23 runs or more of 600, and the chi-square test's p-value is accurate),
#: and a draft far from it (a mistake in the acceptance test or the residual then moves the first token's law
#: by a chi-square divergence of 0.24 or more: a test statistic near 140 against a threshold near 32).
_SMALL_TARGET = (3, 8, 1217, 0.6)
_SMALL_DRAFT = (3, 8, 1217, 0.6, 2217, 3.0)


def _speculative_cases() -> list[Case]:
    return [
        greedy_case("draft = target: every proposal accepted, k=3, 10 new tokens", _TARGET, _TARGET, [1, 2, 3], 10, 3),
        greedy_case("a draft that often agrees, k=4, 16 new tokens", _TARGET, _DRAFT, [5, 0], 16, 4),
        greedy_case("k=1, a one-token prompt, 7 new tokens", _TARGET, _DRAFT, [7], 7, 1),
        sampled_case("temperature 1, 3 tokens, k=2: 600 runs", _SMALL_TARGET, _SMALL_DRAFT, [1, 2], 2, 1.0, 600, 1173),
    ]


def _speculative_plan(hidden: bool) -> list[Step]:
    cases = with_hidden("speculative_generate", _speculative_cases)(hidden)
    return [Step(c.key(), c, "greedy" if len(c.args) == 6 else "sampled") for c in cases]


check_speculative_generate = declare(
    Spec("speculative_generate", _speculative_plan, _judge_speculative,
         runners={"greedy": run_greedy, "sampled": run_sampled}),
    """Run ``speculative_generate(target, draft, prompt_ids, max_new_tokens, k, temperature)`` on stand-in models:
    at temperature 0 the target's greedy tokens and our stats, exactly; at temperature 1, thousands of seeded
    runs whose first two tokens must follow the target's distribution (a chi-square test whose false-alarm rate
    is ``ALPHA``).""")


# --------------------------------------------------------------------------------------------
# ContinuousBatcher: a stand-in paged model and cache, runs step by step
# --------------------------------------------------------------------------------------------
class StandInBlockCache:
    """A cache with ``PagedKVCache``'s interface for the batcher's checks: it counts blocks as a paged cache
    does (a sequence of ``n`` tokens holds ``ceil(n / block_size)`` of ``num_blocks``) but keeps each
    sequence's keys and values in a list of its own. ``key_blocks`` is a meta tensor, for its shape.
    ``peak`` is the most blocks ever held at once."""

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int = 1, head_dim: int = 2):
        self.key_blocks = torch.empty(num_blocks, num_kv_heads, block_size, head_dim, device="meta")
        self.value_blocks = self.key_blocks
        self.block_size, self.total = block_size, num_blocks
        self.seqs: dict[int, list[list[torch.Tensor]]] = {}
        self.peak = 0
        #: How many times the cache may be asked for its free blocks (a batcher whose requests wait for blocks
        #: that are never freed would ask forever).
        self.max_asks, self._asks = 20_000, 0

    def _held(self) -> int:
        return sum(-(-len(k) // self.block_size) for k, _ in self.seqs.values())

    @property
    def num_free_blocks(self) -> int:
        self._asks += 1
        if self._asks > self.max_asks:
            raise RuntimeError(f"the batcher asked the cache for its free blocks {self.max_asks:,} times without "
                               f"finishing: are requests waiting for blocks that are never freed?")
        return self.total - self._held()

    def allocate(self, seq_id: int) -> None:
        if seq_id in self.seqs:
            raise ValueError(f"sequence {seq_id} is already allocated")
        self.seqs[seq_id] = [[], []]

    def _seq(self, seq_id: int) -> list:
        if seq_id not in self.seqs:
            raise KeyError(f"sequence {seq_id} is not allocated (or was freed)")
        return self.seqs[seq_id]

    def append(self, seq_id: int, k: torch.Tensor, v: torch.Tensor) -> None:
        keys, values = self._seq(seq_id)
        more = -(-(len(keys) + k.shape[1]) // self.block_size) - -(-len(keys) // self.block_size)
        if more > self.total - self._held():
            raise RuntimeError(f"out of blocks: sequence {seq_id} needs {more} more blocks, "
                               f"{self.total - self._held()} are free")
        keys.extend(k.unbind(1))
        values.extend(v.unbind(1))
        self.peak = max(self.peak, self._held())

    def gather(self, seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self._seq(seq_id)
        h, d = self.key_blocks.shape[1], self.key_blocks.shape[3]
        if not keys:
            return torch.zeros(h, 0, d), torch.zeros(h, 0, d)
        return torch.stack(keys, dim=1), torch.stack(values, dim=1)

    def block_table(self, seq_id: int) -> list[int]:
        return list(range(-(-len(self._seq(seq_id)[0]) // self.block_size)))  # how many, not which

    def free(self, seq_id: int) -> None:
        self._seq(seq_id)
        del self.seqs[seq_id]


class StandInPagedLM:
    """A paged model with ``serving.PagedTinyGPT``'s call for the batcher's checks: each new token's key is
    ``(token, position)``, appended to the cache, and a sequence's next-token logits are
    ``token[last token] + position[its position] + total[sum of every token in the cache, mod V]`` (tables
    from ``seed``): the tokens written depend on every token the cache holds and on the positions given."""

    def __init__(self, vocab_size: int, context_length: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.vocab_size, self.context_length = vocab_size, context_length
        self.token = torch.randn(vocab_size, vocab_size, generator=g)
        self.position = torch.randn(context_length, vocab_size, generator=g)
        self.total = torch.randn(vocab_size, vocab_size, generator=g)
        self.calls: list[int] = []  # the batch size of each call
        self.max_calls = 5_000

    def __call__(self, cache: Any, seq_ids: Sequence[int], tokens: Sequence[torch.Tensor],
                 positions: Sequence[int]) -> torch.Tensor:
        seq_ids, positions = list(seq_ids), [int(p) for p in positions]
        if not (len(seq_ids) == len(tokens) == len(positions)) or not seq_ids:
            raise ValueError("seq_ids, tokens and positions must be lists of the same length, at least 1")
        self.calls.append(len(seq_ids))
        if len(self.calls) > self.max_calls:
            raise RuntimeError(f"the stand-in model was called more than {self.max_calls:,} times: does the batcher "
                               f"never finish?")
        rows = []
        for seq, new, start in zip(seq_ids, tokens, positions):
            new = torch.as_tensor(new).long().flatten()
            if not len(new) or start < 0 or start + len(new) > self.context_length:
                raise ValueError(f"sequence {seq}: positions {start}..{start + len(new) - 1} are outside "
                                 f"0..{self.context_length - 1}")
            keys = torch.stack([new.float(), torch.arange(start, start + len(new)).float()], dim=1)  # (T, 2)
            cache.append(seq, keys[None], keys[None])
            held = cache.gather(seq)[0][0]  # (tokens held, 2)
            total = int(held[:, 0].sum()) % self.vocab_size
            rows.append(self.token[new[-1]] + self.position[start + len(new) - 1] + self.total[total])
        return torch.stack(rows)  # (n, V)


def serve_case(name: str, model: tuple, cache: tuple, max_batch_size: int,
               requests: Sequence[tuple[Sequence[int], int]]) -> Case:
    """A batcher's case: the stand-in model's ``(V, context_length, seed)``, the stand-in cache's
    ``(num_blocks, block_size)``, the batch size, and the requests ``(prompt, max_new_tokens)`` in order."""
    return Case(name, (tuple(model), tuple(cache), max_batch_size,
                       tuple((torch.tensor(list(p)), n) for p, n in requests)))


def alone(case: Case) -> list[list[int]]:
    """Each request's greedy tokens, written alone on the stand-in model (what any batching must give)."""
    found = []
    for prompt, max_new_tokens in case.args[3]:
        model = StandInPagedLM(*case.args[0])
        cache = StandInBlockCache(1000, 4)
        cache.allocate(0)
        tokens = [int(t) for t in prompt]
        logits = model(cache, [0], [prompt], [0])
        written = []
        while True:
            written.append(int(logits[0].argmax()))
            if len(written) == max_new_tokens:
                break
            logits = model(cache, [0], [torch.tensor(written[-1:])], [len(tokens) + len(written) - 1])
        found.append(written)
    return found


def run_steps(batcher_class: Any, case: Case) -> list:
    """The batcher on fresh stand-ins, step by step until every request wrote its tokens (at most 60 steps):
    ``[request ids, [(n, 2) tensor of [id, token] rows, free blocks after it] per step, the model's batch sizes,
    the cache's peak of blocks held, run()'s result on a second batcher]``."""
    model, cache = StandInPagedLM(*case.args[0]), StandInBlockCache(*case.args[1])
    batcher = batcher_class(model, cache, case.args[2])
    ids = [batcher.add_request(prompt.clone(), n) for prompt, n in case.args[3]]
    left, steps = sum(n for _, n in case.args[3]), []
    while left > 0 and len(steps) < 60:
        wrote = batcher.step()
        pairs = sorted([int(r), int(t)] for r, t in dict(wrote).items())
        steps.append([torch.tensor(pairs, dtype=torch.int64).view(-1, 2), cache.total - cache._held()])
        left -= len(pairs)
    again = batcher_class(StandInPagedLM(*case.args[0]), StandInBlockCache(*case.args[1]), case.args[2])
    for prompt, n in case.args[3]:
        again.add_request(prompt.clone(), n)
    result = again.run()
    ran = [[int(r), [int(t) for t in tokens][:64]] for r, tokens in sorted(dict(result).items())][:64]
    return [[int(i) for i in ids], steps, model.calls[:64], cache.peak, ran]


def _run_or_none(batcher_class: Any, case: Case) -> list | None:
    """:func:`run_steps` of a known mistake, or ``None`` where it raises (its message says enough then)."""
    try:
        return run_steps(batcher_class, case)
    except Exception:  # noqa: BLE001 - a mistake that raises on this case is named by the error's words
        return None


BATCH_FREED_HINT = ("a finished request's blocks must go back to the cache at once (cache.free(request id) in the "
                    "step it writes its last token), so that waiting requests can join")
BATCH_STATIC_HINT = ("admit waiting requests at every step, as soon as the batch has room and the cache has the "
                     "blocks for their tokens: a batch that waits for all its requests to finish is static batching")
BATCH_POSITION_HINT = ("a request's positions continue from its prompt: its first decoded token is read at position "
                       "len(prompt), the next at len(prompt) + 1, whatever step it joined at")
BATCH_ONE_PASS_HINT = ("decode every running request in one forward pass per step: model(cache, ids, tokens, "
                       "positions) with all of them")


def _judge_batcher(plan: list[Step], outcomes: Outcomes) -> str:
    from course_utils.checks import expected

    exercise = "ContinuousBatcher"
    for step in plan:
        case = step.case
        got = outcomes[step.key]
        if isinstance(got, BaseException):
            if core.is_stub_error(got):
                raise core.CheckFailed(f"❌ {exercise}: {core.NOT_IMPLEMENTED}")
            hint = BATCH_POSITION_HINT if "positions" in str(got) and "outside" in str(got) else \
                BATCH_FREED_HINT if "out of blocks" in str(got) or "never freed" in str(got) else None
            core.fail(exercise, f"your code raised {type(got).__name__}: {got}" + (f". Hint: {hint}" if hint else ""),
                      case)
        if not (isinstance(got, list) and len(got) == 5 and isinstance(got[1], list) and all(
                isinstance(s, list) and len(s) == 2 and isinstance(s[0], torch.Tensor) and s[0].dim() == 2
                and s[0].shape[1] == 2 for s in got[1])):
            refuse(exercise, "steps")
        ids, steps, calls, peak, ran = got
        steps = [[pairs.tolist(), free] for pairs, free in steps]
        want = expected.expect(exercise, case.key(), lambda: run_steps(expected.reference(exercise), case))
        want_steps = [[pairs.tolist(), free] for pairs, free in want[1]]
        tokens_alone = expected.expect(exercise, f"alone: {case.key()}", lambda: alone(case))
        mistakes = expected.expect(exercise, f"mistakes: {case.key()}", lambda: [
            [m.hint, _run_or_none(m.wrong, case)] for m in expected.instructor().mistakes(exercise)])
        known = next((hint for hint, outcome in mistakes
                      if outcome is not None and expected.same_value(outcome, got)), None)
        say = (lambda text: core.fail(exercise, f"{text}. Hint: {known}" if known else text, case))
        if ids != list(range(len(case.args[3]))):
            say(f"add_request must return the ids 0, 1, 2, ... in order; yours returned {ids}")
        wrote: dict[int, list[int]] = {i: [] for i in ids}
        for number, (pairs, _) in enumerate(steps):
            if len(pairs) > case.args[2]:
                say(f"step {number + 1} wrote {len(pairs)} tokens, more than max_batch_size={case.args[2]}")
            for rid, token in pairs:
                wrote.setdefault(rid, []).append(token)
        for rid, right in enumerate(tokens_alone):
            if wrote.get(rid, [])[:len(right)] != right[:len(wrote.get(rid, []))] or len(wrote.get(rid, [])) > len(right):
                say(f"request {rid} wrote {wrote.get(rid)}, but alone it writes {right}: batching must not change "
                    f"a request's greedy tokens")
        if [len(wrote.get(rid, [])) for rid in range(len(tokens_alone))] != [len(r) for r in tokens_alone]:
            say(f"after {len(steps)} steps the requests wrote {[len(wrote.get(r, [])) for r in range(len(tokens_alone))]} "
                f"tokens, not {[len(r) for r in tokens_alone]}")
        if [[r, t] for r, t in ran] != [[r, tokens] for r, tokens in enumerate(tokens_alone)]:
            say(f"run() returned {ran}, not each request's tokens {dict(enumerate(tokens_alone))}")
        if len(steps) != len(want_steps):
            hint = known or (BATCH_STATIC_HINT if len(steps) > len(want_steps) else None)
            core.fail(exercise, f"the requests took {len(steps)} steps, ours {len(want_steps)}"
                                + (f". Hint: {hint}" if hint else ""), case)
        for number, ((pairs, free), (want_pairs, want_free)) in enumerate(zip(steps, want_steps)):
            if pairs != want_pairs:
                say(f"step {number + 1} wrote {pairs} ([request, token] pairs), ours {want_pairs}: admit in order "
                    f"while there is room, and preempt the newest request when the blocks run out")
            if free != want_free:
                hint = known or (BATCH_FREED_HINT if free < want_free else None)
                core.fail(exercise, f"after step {number + 1} the cache has {free} free blocks, ours {want_free}"
                                    + (f". Hint: {hint}" if hint else ""), case)
        if calls != want[2]:
            say(f"the model was called with batches of {calls}, ours {want[2]}. Hint: {BATCH_ONE_PASS_HINT}")
    return f"{len(plan)} runs: every request writes its own greedy tokens, with our steps, blocks and forward passes " \
           f"({'; '.join(s.case.name for s in plan)})"


_SERVE_MODEL = (12, 64, 1181)


def _batcher_cases() -> list[Case]:
    return [
        serve_case("4 requests of different lengths, batch of 2, plenty of blocks", _SERVE_MODEL, (40, 4), 2,
                   [([1, 2, 3], 5), ([4], 2), ([5, 6], 7), ([7, 8, 9, 10, 11], 3)]),
        serve_case("6 requests, batch of 3, blocks of 2: requests wait for blocks", _SERVE_MODEL, (9, 2), 3,
                   [([3, 1], 4), ([2], 6), ([9, 9, 9], 2), ([0, 5], 5), ([6], 3), ([1, 1, 1, 1], 4)]),
        serve_case("3 long requests in 6 blocks of 4: preempted and recomputed", _SERVE_MODEL, (6, 4), 3,
                   [([1, 2, 3, 4, 5], 7), ([6, 7], 9), ([8, 9, 10], 8)]),
    ]


check_ContinuousBatcher = declare(
    Spec("ContinuousBatcher",
         lambda hidden: [Step(c.key(), c, "steps")
                         for c in with_hidden("ContinuousBatcher", _batcher_cases)(hidden)],
         _judge_batcher, runners={"steps": run_steps}),
    """Run your ``ContinuousBatcher`` on a stand-in paged model and cache, step by step and with ``run()``: each
    request's tokens equal its greedy tokens alone, and the steps, the free blocks after each and the model's
    batches equal ours (admission in order, one decode pass per step, finished requests freed at once, the newest
    preempted when the blocks run out).""")
