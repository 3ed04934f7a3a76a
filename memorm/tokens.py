"""Token counts for the context budget.

memorm stores a `token_count` on every message so that
[`context`][memorm.repositories.MessageRepository.context] can fit a budget in SQL
without reading message bodies.  When the caller gives no count, the
`Database`'s counter estimates one.  The default, [`estimate_tokens`][memorm.tokens.estimate_tokens], is
deliberately cheap and model-agnostic; pass a real tokenizer for exact budgets:

```python
import tiktoken
enc = tiktoken.get_encoding("o200k_base")
db = Database(token_counter=lambda m: 4 + len(enc.encode(m["content"])))
```
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["MESSAGE_OVERHEAD", "TokenCounter", "estimate_tokens"]

TokenCounter = Callable[[Mapping[str, Any]], int]
"""Counts a message given as a mapping with `role`, `content`, `name`, `tool_calls`."""

MESSAGE_OVERHEAD = 4  # role and framing tokens chat formats add per message


def estimate_tokens(message: Mapping[str, Any]) -> int:
    """About one token per 4 characters of content, name and tool calls, plus 4 per message.

    OpenAI's rule of thumb for English text; it over-counts code and
    under-counts CJK text, so give a real tokenizer where the budget is tight.
    """
    chars = len(message.get("content") or "") + len(message.get("name") or "")
    tool_calls = message.get("tool_calls")
    if tool_calls:
        chars += len(json.dumps(tool_calls, separators=(",", ":")))
    return MESSAGE_OVERHEAD + (chars + 3) // 4
