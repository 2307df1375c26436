"""Choosing where tensors live."""

from __future__ import annotations

import os

import torch


def get_device(prefer: str | None = None) -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU.

    Args:
        prefer: force a device by name (``"cpu"``, ``"cuda"``, ``"mps"``); raises ``RuntimeError``
            if that device is not available here.
    """
    if prefer is not None:
        name = prefer.split(":")[0]
        if name == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was asked for, but torch.cuda.is_available() is False here")
        if name == "mps" and not _mps_available():
            raise RuntimeError("device 'mps' was asked for, but the MPS backend is not available here")
        return torch.device(prefer)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def describe_device(device: torch.device | str) -> str:
    """A one-line human description, e.g. ``"cuda: NVIDIA H100 80GB HBM3"`` or ``"cpu: 2 threads"``."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda: {torch.cuda.get_device_name(device)}"
    if device.type == "cpu":
        return f"cpu: {torch.get_num_threads()} threads"
    return device.type


def under_grader() -> bool:
    """Whether nbgrader is running this notebook: it sets ``NBGRADER_EXECUTION`` while it autogrades
    or validates. Notebooks skip slow demonstrations that no graded cell needs (training, timing
    sweeps) then, and say so."""
    return bool(os.environ.get("NBGRADER_EXECUTION"))
