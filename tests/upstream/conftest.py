"""Deselect the upstream cases each suite leaves out (their reasons: the suites' ``left_out``, README.md)."""

from __future__ import annotations

import pytest

from .loader import LEFT_OUT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Drop the cases a suite's ``left_out`` names, reported as deselected."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        left_out = getattr(getattr(item, "module", None), LEFT_OUT, {})
        (dropped if getattr(item, "originalname", item.name) in left_out else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
