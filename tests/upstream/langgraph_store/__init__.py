"""LangGraph's own store tests, fetched from its sdists and run against ``MemormStore`` (README.md here)."""
