"""Copy detection (grader/similarity.py): what it flags, what it must not, and that it
stays out of the scores and the students' feedback.

The answers are hand-written sources (or generated from the course's solutions, for a class of 200);
no kernel runs: the one test through ``autograde()`` replaces nbgrader with a stand-in.
"""

from __future__ import annotations

import csv
import inspect
import random
import re
from copy import deepcopy

import nbformat
import pytest

from course_utils import reference
from grader import course, similarity
from grader.autograde import CellResult, Result, write_reports, write_similarity
from grader.similarity import REFERENCE, SOLUTION, Pair, compare_answers, find_similar
from tests.support.synthetic_class import SYNTHETIC_EXERCISES, rename, synthetic_class

CAUSAL_STUB = similarity.course_stub("04_causal_attention", "CausalAttention")
CAW_STUB = similarity.course_stub("04_causal_attention", "causal_attention_weights")
DOT_STUB = similarity.course_stub("01_dot_products", "dot")


def flagged(pairs: list[Pair]) -> set[tuple[str, str]]:
    return {(p.student_a, p.student_b) for p in pairs}


def fill(stub: str, *bodies: str) -> str:
    """The stub with its ``# YOUR CODE HERE / raise NotImplementedError()`` blocks replaced, in order,
    by ``bodies`` (each written unindented; it takes the block's indentation)."""
    blocks = list(re.finditer(r"^([ \t]*)# YOUR CODE HERE\n[ \t]*raise NotImplementedError\(\)", stub, re.M))
    assert len(blocks) == len(bodies), (len(blocks), stub)
    out, last = [], 0
    for m, body in zip(blocks, bodies):
        indent = m.group(1)
        out.append(stub[last:m.start()])
        out.append("\n".join(indent + line if line.strip() else "" for line in body.strip("\n").splitlines()))
        last = m.end()
    out.append(stub[last:])
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# causal_attention_weights: one answer and its disguised copies, and independent answers.

CAW_ORIGINAL = """
n = queries.shape[-2]
dk = keys.shape[-1]
raw = torch.matmul(queries, keys.transpose(-1, -2)) / dk ** 0.5
future = torch.ones(n, n, dtype=torch.bool, device=raw.device).triu(1)
raw = raw.masked_fill(future, -1e9)
raw = raw - raw.amax(dim=-1, keepdim=True)
expd = torch.exp(raw)
return expd / expd.sum(dim=-1, keepdim=True)
"""

CAW_RENAMED = """
T = queries.shape[-2]
head_size = keys.shape[-1]
s = torch.matmul(queries, keys.transpose(-1, -2)) / head_size ** 0.5
m = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
s = s.masked_fill(m, -1e9)
s = s - s.amax(dim=-1, keepdim=True)
e = torch.exp(s)
return e / e.sum(dim=-1, keepdim=True)
"""

CAW_REFORMATTED = """
n = queries.shape[ -2 ]
dk = keys.shape[ -1 ]
raw = (
    torch.matmul(queries,
                 keys.transpose(-1, -2))
    / dk**0.5
)
future = torch.ones(
    n, n, dtype = torch.bool, device = raw.device
).triu(1)
raw = raw.masked_fill(future, -1e9)
raw = raw - raw.amax(dim = -1, keepdim = True)
expd = torch.exp(raw)
return (expd
        / expd.sum(dim=-1, keepdim=True))
"""

CAW_COMMENTED = """
# number of tokens
n = queries.shape[-2]

# size of one key, for the scaling
dk = keys.shape[-1]

# scaled scores (T, T)
raw = torch.matmul(queries, keys.transpose(-1, -2)) / dk ** 0.5  # see lecture 3

# True above the diagonal = the future
future = torch.ones(n, n, dtype=torch.bool, device=raw.device).triu(1)
raw = raw.masked_fill(future, -1e9)  # hide the future


# stable softmax
raw = raw - raw.amax(dim=-1, keepdim=True)
expd = torch.exp(raw)
return expd / expd.sum(dim=-1, keepdim=True)  # rows sum to one
"""

CAW_HELPER = """
def _softmax_rows(raw):
    raw = raw - raw.amax(dim=-1, keepdim=True)
    expd = torch.exp(raw)
    return expd / expd.sum(dim=-1, keepdim=True)

n = queries.shape[-2]
dk = keys.shape[-1]
raw = torch.matmul(queries, keys.transpose(-1, -2)) / dk ** 0.5
future = torch.ones(n, n, dtype=torch.bool, device=raw.device).triu(1)
raw = raw.masked_fill(future, -1e9)
return _softmax_rows(raw)
"""

# Independent: the same result through torch.softmax and tril, or an explicit loop over rows.
CAW_INDEPENDENT_TRIL = """
scores = queries @ keys.transpose(-2, -1)
scores = scores / math.sqrt(queries.size(-1))
T = scores.size(-1)
keep = torch.tril(torch.ones(T, T, device=scores.device)).bool()
scores = torch.where(keep, scores, torch.full_like(scores, float("-inf")))
return torch.softmax(scores, dim=-1)
"""

CAW_INDEPENDENT_LOOP = """
T, d = queries.shape[-2], queries.shape[-1]
weights = torch.zeros(*queries.shape[:-1], T, dtype=queries.dtype)
for i in range(T):
    row = (queries[..., i, :].unsqueeze(-2) * keys[..., : i + 1, :]).sum(-1) / d ** 0.5
    weights[..., i, : i + 1] = torch.softmax(row, dim=-1)
return weights
"""


@pytest.mark.parametrize("copy", ["CAW_RENAMED", "CAW_REFORMATTED", "CAW_COMMENTED", "CAW_HELPER"])
def test_disguised_copies_are_flagged(copy):
    answers = {"ana": fill(CAW_STUB, CAW_ORIGINAL), "ben": fill(CAW_STUB, globals()[copy]),
               "cy": fill(CAW_STUB, CAW_INDEPENDENT_TRIL), "dee": fill(CAW_STUB, CAW_INDEPENDENT_LOOP)}
    pairs = compare_answers(answers, stub=CAW_STUB)
    assert flagged(pairs) == {("ana", "ben")}, pairs
    assert pairs[0].similarity >= similarity.THRESHOLD and pairs[0].matched_tokens >= similarity.MIN_MATCHED_TOKENS


def test_renaming_comments_and_formatting_leave_the_fingerprints_unchanged():
    a = similarity.fingerprint(fill(CAW_STUB, CAW_ORIGINAL))
    for copy in (CAW_RENAMED, CAW_COMMENTED, CAW_REFORMATTED):
        b = similarity.fingerprint(fill(CAW_STUB, copy))
        assert (b.normalised, b.hashes) == (a.normalised, a.hashes)


def test_string_contents_are_normalised():
    a = similarity.fingerprint('def f(x):\n    raise ValueError(f"x must be positive, got {x}")\n    return "ok"\n')
    b = similarity.fingerprint("def g(y):\n    raise ValueError(f'y is negative: {y}')\n    return 'fine'\n")
    assert a.normalised == b.normalised


def test_a_copy_of_the_reference_is_flagged():
    originals = similarity.course_originals("04_causal_attention", "CausalAttention")
    assert set(originals) == {SOLUTION, REFERENCE}
    pasted = inspect.getsource(reference.CausalAttention).replace("num_tokens", "n_tok").replace("weights", "attn")
    answers = {"eve": pasted, "cy": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[0]),
               "dee": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[1])}
    pairs = compare_answers(answers, stub=CAUSAL_STUB, originals=originals)
    assert ("eve", REFERENCE) in flagged(pairs), pairs
    assert {a for a, _ in flagged(pairs)} == {"eve"}, pairs


def test_a_pasted_solution_is_flagged_through_find_similar():
    solution = similarity.course_originals("04_causal_attention", "causal_attention_weights")[SOLUTION]
    results = [Result("fay", "04_causal_attention", 0, 0, "ok", "f", answers={"causal_attention_weights": solution}),
               Result("gus", "04_causal_attention", 0, 0, "ok", "g",
                      answers={"causal_attention_weights": fill(CAW_STUB, CAW_INDEPENDENT_LOOP)})]
    pairs = find_similar(results)
    assert flagged(pairs) == {("fay", SOLUTION)}, pairs
    assert pairs[0].notebook == "04_causal_attention" and pairs[0].exercise == "causal_attention_weights"


# ---------------------------------------------------------------------------------------------
# Independent answers with the same result are not flagged.

SPLIT_STUB = similarity.course_stub("05_multi_head_attention", "split_heads")

SPLIT_VIEW = """
b, t, d = x.shape
head_dim = d // num_heads
return x.view(b, t, num_heads, head_dim).transpose(1, 2)
"""

SPLIT_RESHAPE = """
batch, tokens, width = x.size()
out = x.reshape(batch, tokens, num_heads, -1)
out = out.permute(0, 2, 1, 3)
return out.contiguous()
"""

DOT_LOOP = """
acc = 0.0
for i in range(len(x)):
    acc = acc + x[i] * y[i]
return torch.as_tensor(acc)
"""

DOT_EINSUM = """
return torch.einsum("i,i->", x, y)
"""


def test_independent_answers_are_not_flagged():
    pairs = compare_answers({"a": fill(DOT_STUB, DOT_LOOP), "b": fill(DOT_STUB, DOT_EINSUM)}, stub=DOT_STUB)
    assert pairs == []
    pairs = compare_answers({"a": fill(SPLIT_STUB, SPLIT_VIEW), "b": fill(SPLIT_STUB, SPLIT_RESHAPE)}, stub=SPLIT_STUB)
    assert pairs == []


def _canonical_dot(rng: random.Random) -> str:
    """The short loop everyone writes, with each student's names and small habits."""
    acc, i = rng.choice(["total", "s", "acc", "result", "out", "res"]), rng.choice(["i", "k", "j", "idx"])
    init = rng.choice(["0", "0.0", "torch.tensor(0.0)"])
    n = rng.choice(["len(x)", "x.shape[0]", "x.size(0)"])
    step = rng.choice([f"{acc} += x[{i}] * y[{i}]", f"{acc} = {acc} + x[{i}] * y[{i}]"])
    return fill(DOT_STUB, f"{acc} = {init}\nfor {i} in range({n}):\n    {step}\nreturn {acc}")


def test_thirty_students_with_the_canonical_short_answer_are_not_flagged():
    rng = random.Random(0)
    answers = {f"s{n:02d}": _canonical_dot(rng) for n in range(30)}
    assert len(set(answers.values())) > 10  # genuinely different texts, the same normalised answer
    originals = similarity.course_originals("01_dot_products", "dot")
    assert compare_answers(answers, stub=DOT_STUB, originals=originals) == []


def test_the_share_threshold_is_what_hides_a_class_wide_answer():
    rng = random.Random(0)
    answers = {f"s{n:02d}": _canonical_dot(rng) for n in range(30)}
    # With no one ignored, some identical canonical answers would be flagged: the threshold matters.
    loose = compare_answers(answers, stub=DOT_STUB, max_share=30, min_tokens=0)
    assert loose


# ---------------------------------------------------------------------------------------------
# CausalAttention: three students share one answer in a class of six.

CAUSAL_SHARED = (
    """
self.d_out = d_out
self.q_proj = nn.Linear(d_in, d_out, bias=qkv_bias)
self.k_proj = nn.Linear(d_in, d_out, bias=qkv_bias)
self.v_proj = nn.Linear(d_in, d_out, bias=qkv_bias)
self.drop = nn.Dropout(dropout)
self.register_buffer("causal", torch.tril(torch.ones(context_length, context_length)) == 0)
""",
    """
n = x.shape[1]
q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
att = torch.bmm(q, k.transpose(1, 2)) * (1.0 / math.sqrt(self.d_out))
att = att.masked_fill(self.causal[:n, :n], float("-inf"))
att = self.drop(F.softmax(att, dim=-1))
return torch.bmm(att, v)
""")

CAUSAL_INDEPENDENT = [
    (  # one fused projection, split afterwards
        """
self.qkv = nn.Linear(d_in, 3 * d_out, bias=qkv_bias)
self.dropout = nn.Dropout(dropout)
self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length, dtype=torch.bool), 1))
""",
        """
T = x.size(1)
q, k, v = self.qkv(x).chunk(3, dim=-1)
w = q @ k.transpose(-2, -1) / k.size(-1) ** 0.5
w = w.masked_fill(self.mask[:T, :T], float("-inf"))
return self.dropout(w.softmax(-1)) @ v
"""),
    (  # raw parameter matrices, scores built with einsum
        """
self.Wq = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
self.Wk = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
self.Wv = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
self.p = dropout
mask = torch.ones(context_length, context_length).triu(diagonal=1).bool()
self.register_buffer("future", mask)
""",
        """
q = torch.einsum("btd,de->bte", x, self.Wq)
k = torch.einsum("btd,de->bte", x, self.Wk)
v = torch.einsum("btd,de->bte", x, self.Wv)
T = q.shape[1]
s = torch.einsum("bqe,bke->bqk", q, k) / math.sqrt(q.shape[-1])
s[:, self.future[:T, :T]] = float("-inf")
p = torch.nn.functional.dropout(torch.softmax(s, dim=-1), self.p, self.training)
return torch.einsum("bqk,bke->bqe", p, v)
"""),
    (  # the book's shape, written out step by step
        """
self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
self.dropout = nn.Dropout(dropout)
self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))
""",
        """
b, num_tokens, d_in = x.shape
keys = self.W_key(x)
queries = self.W_query(x)
values = self.W_value(x)
attn_scores = queries @ keys.transpose(1, 2)
attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
attn_weights = self.dropout(attn_weights)
context_vec = attn_weights @ values
return context_vec
"""),
]


def test_three_of_six_sharing_one_causal_attention_are_flagged():
    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    answers = {
        "hal": shared,
        "ida": rename(shared, {"q_proj": "to_q", "k_proj": "to_k", "v_proj": "to_v", "att": "scores", "drop": "dp"}),
        "jon": "# attention, finally\n" + shared.replace("\n\n", "\n\n\n").replace(", v)", ",  v)  # done"),
        "kim": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[0]),
        "lea": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[1]),
        "max": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[2]),
    }
    originals = similarity.course_originals("04_causal_attention", "CausalAttention")
    pairs = compare_answers(answers, stub=CAUSAL_STUB, originals=originals)
    assert flagged(pairs) == {("hal", "ida"), ("hal", "jon"), ("ida", "jon")}, pairs


def test_an_unanswered_stub_is_never_compared():
    answers = {"a": CAUSAL_STUB, "b": CAUSAL_STUB, "c": CAUSAL_STUB + "\n"}
    assert compare_answers(answers, stub=CAUSAL_STUB) == []


# ---------------------------------------------------------------------------------------------
# A class of 200 students, every exercise of notebooks 01 to 06 (its speed: scripts/bench_checks.py).


def test_a_class_of_200_on_notebooks_01_to_06_flags_the_planted_and_generated_copies_only():
    results, author = synthetic_class(200)
    assert sum(len(r.answers) for r in results) == 200 * SYNTHETIC_EXERCISES
    # Planted among them: three students share one CausalAttention, two one causal_attention_weights.
    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    planted = {("student010", "CausalAttention"): shared,
               ("student020", "CausalAttention"): rename(shared, {"att": "a", "q_proj": "q"}),
               ("student030", "CausalAttention"): "# mine\n" + shared,
               ("student040", "causal_attention_weights"): fill(CAW_STUB, CAW_ORIGINAL),
               ("student050", "causal_attention_weights"): fill(CAW_STUB, CAW_REFORMATTED)}
    for r in results:
        for exercise in r.answers:
            if (r.student_id, exercise) in planted:
                r.answers[exercise] = planted[(r.student_id, exercise)]
                author[(exercise, r.student_id)] = "planted"
    pairs = find_similar(results)
    found = {(p.exercise, p.student_a, p.student_b) for p in pairs}
    assert {("CausalAttention", "student010", "student020"), ("CausalAttention", "student010", "student030"),
            ("CausalAttention", "student020", "student030"),
            ("causal_attention_weights", "student040", "student050")} <= found
    # Every other flag is one of the generated copies (most copy an answer close to the course's
    # own, whose code is common and ignored, so only some are flagged); nothing is flagged by chance.
    assert all(author[(ex, a)] == author[(ex, b)] for ex, a, b in found), found


def test_copy_detection_gives_the_same_pairs_every_time():
    results, _ = synthetic_class(40)
    pairs = find_similar(results)
    assert pairs, "the synthetic class of 40 holds generated copies"
    assert pairs == find_similar(results)


# ---------------------------------------------------------------------------------------------
# Where the findings go: similarity.csv and the instructor's report, never a score or feedback.


def _graded(student: str, notebook: str, answers: dict[str, str], score: float = 1.0) -> Result:
    cells = [CellResult(f"test_{ex}", score, 1.0, auto_score=score, message="ok") for ex in answers]
    return Result(student, notebook, score * len(cells), float(len(cells)), "ok", f"{student}/{notebook}.ipynb",
                  cells, answers=answers, tests_shown={c.grade_id: "check()" for c in cells})


def test_csv_and_report_section_from_results(tmp_path):
    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    results = [_graded("hal", "04_causal_attention", {"CausalAttention": shared}),
               _graded("ida", "04_causal_attention", {"CausalAttention": rename(shared, {"att": "a", "drop": "d"})}),
               _graded("kim", "04_causal_attention", {"CausalAttention": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[0])})]
    pairs = find_similar(results)
    write_similarity(tmp_path, pairs)
    write_reports(tmp_path, results, pairs)
    with open(tmp_path / "similarity.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["notebook", "exercise", "student_a", "student_b", "similarity", "matched_tokens"]
    assert [r[:4] for r in rows[1:]] == [["04_causal_attention", "CausalAttention", "hal", "ida"]]
    assert 0.8 <= float(rows[1][4]) <= 1 and int(rows[1][5]) >= similarity.MIN_MATCHED_TOKENS
    for student, partner in (("hal", "ida"), ("ida", "hal")):
        report = (tmp_path / "reports" / f"{student}.md").read_text()
        section = report.split("## Similarity (instructor only)")[1]
        assert f"| 04_causal_attention | CausalAttention | {partner} |" in section
    assert "Similarity" not in (tmp_path / "reports" / "kim.md").read_text()


def test_csv_has_its_header_when_nothing_is_flagged(tmp_path):
    write_similarity(tmp_path, [])
    assert (tmp_path / "similarity.csv").read_text().splitlines() == [
        "notebook,exercise,student_a,student_b,similarity,matched_tokens"]


def test_csv_rows_are_sorted(tmp_path):
    pairs = [Pair("05_x", "b", "a", "c", 0.9, 50), Pair("04_x", "z", "b", "c", 1.0, 60),
             Pair("04_x", "z", "a", SOLUTION, 0.85, 70), Pair("04_x", "a", "b", "d", 0.8, 45)]
    write_similarity(tmp_path, pairs)
    with open(tmp_path / "similarity.csv", newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [r[:4] for r in rows] == [["04_x", "a", "b", "d"], ["04_x", "z", "a", SOLUTION], ["04_x", "z", "b", "c"],
                                     ["05_x", "b", "a", "c"]]


def test_finding_pairs_changes_no_result():
    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    results = [_graded("hal", "04_causal_attention", {"CausalAttention": shared}, 0.0),
               _graded("ida", "04_causal_attention", {"CausalAttention": shared}, 1.0)]
    before = deepcopy(results)
    assert find_similar(results)
    assert results == before


def _submission(notebook: str, answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(course.notebooks_dir() / f"{notebook}.ipynb", as_version=4)
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader") or {}
        if meta.get("solution") and meta.get("grade_id") in answers:
            cell.source = answers[meta["grade_id"]]
    return nb


def _fake_grading(monkeypatch) -> None:
    """autograde() with nbgrader and the sandbox left out: each test scores 1 if its exercise's
    answer contains ``softmax``, else 0. Intake, merging, the CSVs, results.json and reports are real."""
    from grader import autograde as ag
    from grader import warm

    def prepare_course(root, notebooks, settings=None):
        root.mkdir(parents=True, exist_ok=True)
        (root / "gradebook.db").write_bytes(b"")

    def run_pool(per_student, workers, root, work_root, settings, record, prestarted=None):
        assert prestarted is None  # no grading process here: no warm parent started for one
        for js in per_student.values():
            rows = []
            for j in js:
                src = ag.intake.load_source(j.notebook)
                cells = [CellResult(t, float("softmax" in j.answers.get(test.exercise, "")), test.points,
                                    message=f"checked {t}") for t, test in src.tests.items()]
                rows.append(Result(j.student_id, j.notebook, sum(c.score for c in cells), src.max_score, "ok",
                                   j.file, cells, j.repairs, j.violations, {t: "check()" for t in src.tests},
                                   j.answers))
            record(js, rows)
        return []

    monkeypatch.setattr(ag, "sandbox_settings", lambda allow: (True, ""))
    monkeypatch.setattr(ag, "prepare_course", prepare_course)
    monkeypatch.setattr(ag, "_run_pool", run_pool)
    monkeypatch.setattr(warm, "prestart", lambda *args: None)
    monkeypatch.setattr(ag, "merge_into_gradebook", lambda root, results, files_root, db_url=None: None)


def test_similarity_never_changes_a_score_and_never_reaches_feedback(tmp_path, monkeypatch):
    from grader import autograde as ag
    from grader.feedback import feedback

    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    class_ = {"student_hal": shared, "student_ida": rename(shared, {"att": "a", "drop": "d"}),
              "student_kim": fill(CAUSAL_STUB, *CAUSAL_INDEPENDENT[0])}
    subs = tmp_path / "submissions"
    for student, answer in class_.items():
        (subs / student).mkdir(parents=True)
        nbformat.write(_submission("04_causal_attention", {"CausalAttention": answer}),
                       subs / student / "04_causal_attention.ipynb")
    _fake_grading(monkeypatch)
    with_similarity, without = tmp_path / "with", tmp_path / "without"
    assert ag.autograde(subs, with_similarity, progress=False) == 0
    monkeypatch.setattr(similarity, "find_similar", lambda results, **kw: [])
    assert ag.autograde(subs, without, progress=False) == 0

    with open(with_similarity / "similarity.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["student_a"], r["student_b"]) for r in rows] == [("student_hal", "student_ida")]
    for name in ("grades.csv", "cells.csv", "results.json"):
        assert (with_similarity / name).read_bytes() == (without / name).read_bytes(), name
    assert "similar" not in (with_similarity / "results.json").read_text().lower()
    for student in class_:
        report = (with_similarity / "reports" / f"{student}.md").read_text()
        plain = (without / "reports" / f"{student}.md").read_text()
        assert report.startswith(plain)  # the section is added at the end, nothing else changes
        assert (report[len(plain):].startswith("\n## Similarity (instructor only)")) == (student != "student_kim")

    pages = feedback(with_similarity)
    assert len(pages) == 3
    for page in pages:
        text = page.read_text().lower()
        for word in ("similar", "instructor only", "matched", "solution&gt;", "reference&gt;", "<solution>"):
            assert word not in text, (page, word)
        others = [s for s in class_ if s != page.parent.name]
        assert not any(s in text for s in others), page


def test_cli_option_reaches_autograde(monkeypatch):
    from grader import autograde as ag
    from grader.cli import build_parser, main

    args = build_parser().parse_args(["autograde", "s", "--out", "o"])
    assert args.similarity_max_share == similarity.MAX_SHARE == 10
    seen = {}
    monkeypatch.setattr(ag, "autograde", lambda *args, **kwargs: seen.update(kwargs) or 0)
    assert main(["autograde", "s", "--out", "o", "--similarity-max-share", "4"]) == 0
    assert seen["similarity_max_share"] == 4


def test_max_share_is_the_moss_threshold():
    """An answer shared by 4 students is a finding with max_share 10, common code with max_share 3."""
    shared = fill(CAUSAL_STUB, *CAUSAL_SHARED)
    answers = {f"s{i}": rename(shared, {"att": f"a{i}"}) for i in range(4)}
    assert len(compare_answers(answers, stub=CAUSAL_STUB)) == 6
    assert compare_answers(answers, stub=CAUSAL_STUB, max_share=3) == []
