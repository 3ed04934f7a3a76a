"""Importers of other agent frameworks' saved state (JSON only; nothing is ever unpickled)."""

from memorm.legacy.memgpt import ImportResult, LegacyAgent, import_agents, read_directory

__all__ = ["ImportResult", "LegacyAgent", "import_agents", "read_directory"]
