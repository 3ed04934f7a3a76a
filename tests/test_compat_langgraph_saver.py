"""MemormSaver: LangGraph's checkpointer conformance suite, on both engines (and Citus)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import Capability

from memorm import Database
from memorm.compat.langgraph import MemormSaver

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("capability", [c.value for c in Capability])
async def test_langgraph_conformance_suite_passes(db: Database, capability: str) -> None:
    async with db.unit_of_work() as uow:
        agent = await uow.agents.create("graph")

    @checkpointer_test(name=f"MemormSaver-{capability}")
    async def saver() -> AsyncIterator[MemormSaver]:
        yield MemormSaver(db, agent=agent.id)

    report = await validate(saver, capabilities={capability})
    result = report.results[capability]
    assert result.detected, f"{capability} is not implemented"
    assert result.passed, "\n".join(result.failures)
    assert result.tests_failed == 0
    assert result.tests_passed > 0


def test_importing_memorm_does_not_import_langgraph() -> None:
    code = (
        "import sys, memorm, memorm.compat, memorm.uow; "
        "assert not [m for m in sys.modules if m.startswith('langgraph')], 'langgraph imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
