"""Self-checks for notebook 09: the capstone, a tiny causal transformer."""

from __future__ import annotations

__all__: list[str] = []
