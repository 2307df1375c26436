"""Self-checks for notebook 02."""

from __future__ import annotations

__all__: list[str] = []
