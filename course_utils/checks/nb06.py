"""Self-checks for notebook 06."""

from __future__ import annotations

__all__: list[str] = []
