"""Drop-in memory for agent frameworks, each a thin layer over memorm's repositories.

* :mod:`memorm.compat.memgpt`: MemGPT-style archival, recall and persistence classes.
* :mod:`memorm.compat.langchain`: chat message history and vector store (extra ``langchain``).
* :mod:`memorm.compat.openai_agents`: the Agents SDK's session protocol (extra ``openai-agents``).

Importing :mod:`memorm` never imports a framework; only these modules do.
"""
