"""Self-checks for notebook 03."""

from __future__ import annotations

__all__: list[str] = []
