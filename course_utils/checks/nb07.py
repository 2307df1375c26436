"""Self-checks for notebook 07: FlashAttention from scratch."""

from __future__ import annotations

__all__: list[str] = []
