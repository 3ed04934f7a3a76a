"""LangGraph's own graph tests (the `langgraph` sdist's), with memorm's saver as their checkpointer."""
