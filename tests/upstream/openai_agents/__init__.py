"""The OpenAI Agents SDK's own session tests, fetched from its sdist, run against ``MemormSession``."""
