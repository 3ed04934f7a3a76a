"""Drop-in memory for agent frameworks, each a thin layer over memorm's repositories.

* [`memorm.compat.memgpt`][memorm.compat.memgpt]: MemGPT-style archival, recall and persistence classes.
* `memorm.compat.langchain`: chat message history and vector store (extra `langchain`).
* `memorm.compat.openai_agents`: the Agents SDK's session protocol (extra `openai-agents`).
* `memorm.compat.langgraph`: a LangGraph checkpointer and long-term store (extra `langgraph`).
* `memorm.compat.adk`: Google ADK's session service (extra `adk`).

Importing `memorm` never imports a framework; only these modules do.  One
imported without its extra raises a `ModuleNotFoundError` naming the extra
to install (`memorm.compat._extras`).
"""
