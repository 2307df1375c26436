"""check-release compares recordings as "the answer changed", not "the CPU changed".

Another CPU rounds float32 differently (a few units in the last place); a changed reference, a new or
dropped case, another shape or dtype, or NaN in new places is a real change and must still fail.
"""

from __future__ import annotations

import math
import shutil

import pytest
import torch

from course_utils import reference
from course_utils.checks import expected
from grader import course, record

NAME = course.NOTEBOOKS[0]  # 01: quick to record


@pytest.fixture()
def stored(tmp_path):
    """A copy of notebook 01's recording that a test may edit: ``(data, save)``."""
    shutil.copytree(expected.DATA_DIR, tmp_path / "expected")
    path = tmp_path / "expected" / f"{NAME}.pt"
    data = expected.load(path)

    def save() -> dict[str, str]:
        expected.save(data, path)
        return record.stale([NAME], tmp_path / "expected")

    return data, save


def _float_keys(data: dict) -> list[str]:
    return [k for k, v in data.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 1]


def test_the_stored_recording_is_fresh(stored):
    _, save = stored
    assert save() == {}


def test_another_cpus_rounding_is_not_a_change(stored):
    data, save = stored
    for key in _float_keys(data):
        noise = torch.randn(data[key].shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        data[key] = (data[key].double() * (1 + 4e-7 * noise)).to(data[key].dtype)  # about 3 ulp of float32
    assert save() == {}


def test_a_changed_reference_is_stale(monkeypatch, stored):
    _, save = stored
    original = reference.attention_scores
    monkeypatch.setattr(reference, "attention_scores", lambda inputs: original(inputs) * 1.001)
    problems = save()
    assert list(problems) == [NAME] and "attention_scores|" in problems[NAME] and "values changed" in problems[NAME]


def test_a_new_case_is_stale(stored):
    data, save = stored
    key = _float_keys(data)[0]
    del data[key]
    assert "new: not in the recording" in save()[NAME]


def test_a_dropped_case_is_stale(stored):
    data, save = stored
    data["dot|a case no check asks for"] = torch.zeros(3)
    assert "dropped" in save()[NAME]


@pytest.mark.parametrize("edit, words", [
    (lambda t: t.unsqueeze(0), "shape"),
    (lambda t: t.double(), "dtype"),
    (lambda t: t.index_fill(0, torch.tensor([0]), math.nan), "NaN in other places"),
    (lambda t: t.index_fill(0, torch.tensor([0]), math.inf), "infinities in other places"),
    (lambda t: t + 1e-3, "values changed"),
], ids=["shape", "dtype", "nan", "inf", "values"])
def test_a_real_change_is_stale(stored, edit, words):
    data, save = stored
    key = _float_keys(data)[0]
    data[key] = edit(data[key])
    assert words in save()[NAME]


@pytest.mark.parametrize("old, new, same", [
    (1.0, 1.0 + 1e-7, True),
    (1.0, 1.001, False),
    (3, 3, True),
    (3, 4, False),
    (1, 1.0, False),
    ("causal", "causal", True),
    ("causal", "causal ", False),
    (math.nan, math.nan, True),
    (math.nan, 0.0, False),
    ([torch.ones(2), "hint"], [torch.ones(2), "hint"], True),
    ([torch.ones(2), "hint"], [torch.ones(2), "other hint"], False),
    ((torch.ones(2),), [torch.ones(2)], False),
    ({"a": 1}, {"b": 1}, False),
    (torch.tensor([True, False]), torch.tensor([True, True]), False),
    (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.tensor([1.0, 2.0078125], dtype=torch.bfloat16), True),
])
def test_value_difference(old, new, same):
    assert (expected.value_difference(old, new) is None) is same


def test_recording_again_leaves_a_file_that_only_differs_by_noise_untouched(stored, tmp_path):
    data, save = stored
    key = _float_keys(data)[0]
    data[key] = data[key] * (1 + 2e-7)
    save()
    path = tmp_path / "expected" / f"{NAME}.pt"
    before = path.read_bytes()
    record.write([NAME], tmp_path / "expected")
    assert path.read_bytes() == before
    data[key] = data[key] + 1  # a real change is written over
    save()
    record.write([NAME], tmp_path / "expected")
    assert record.stale([NAME], tmp_path / "expected") == {} and path.read_bytes() != before


def test_the_recorded_random_streams_are_this_torchs():
    """``versions.RECORDED_RANDOM_STREAMS`` is what the PyTorch that records (the course environment's)
    draws: when the pinned torch changes, the recordings and this constant change together."""
    from course_utils import versions

    assert versions.random_streams() == versions.RECORDED_RANDOM_STREAMS, (
        f"this torch ({torch.__version__}) draws {versions.random_streams()}: re-record the expectations "
        f"(make build) and set versions.RECORDED_RANDOM_STREAMS to it")
