"""The SDK's tests/memory/test_session_limit.py (openai-agents 0.24.0), on MemormSession."""

from .suite import AGENTS

globals().update(AGENTS.cases("memory.test_session_limit"))
