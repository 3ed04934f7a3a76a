"""The SDK's tests/extensions/memory/test_sqlalchemy_session.py (openai-agents 0.24.0), on MemormSession."""

from .suite import AGENTS

globals().update(AGENTS.cases("extensions.memory.test_sqlalchemy_session"))
