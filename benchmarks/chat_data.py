"""The chat the benchmarks write and read: varied text and a small ``meta`` dict on every message.

A message built from one repeated sentence and no ``meta`` hides costs real
chats pay: serialising and validating JSON, texts of different lengths and
words (the full-text words memorm derives), token counts that differ from
row to row (what ``context()`` sums).  So the messages here alternate short
user turns and longer assistant turns of Zipf-distributed words (a few
non-ASCII), each with the ``meta`` an agent server keeps (source, turn,
model, latency, token usage, a float, sometimes tags), all drawn from a
seeded generator: the same call gives the same messages.

About 150 tokens a message on average, so ``context(max_tokens=8000)``
keeps about as many messages as ``window(limit=50)`` reads.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping, Sequence
from typing import Any

from memorm import Message

__all__ = ["SYSTEM", "as_models", "chat_text", "make_messages"]

SYSTEM: dict[str, Any] = {
    "role": "system",
    "content": "You are Sam, a travel assistant. Be brief, check dates twice, and never book without asking.",
    "meta": {"prompt_version": 3, "persona": "sam"},
}

_COMMON = [
    *("the", "a", "to", "and", "of", "I", "you", "it", "is", "in", "that", "for", "on", "my", "your"),
    *("with", "be", "this", "we", "can", "flight", "hotel", "booking", "Thursday", "meeting", "trip"),
    *("please", "thanks", "café", "über", "naïve", "déjà", "vu", "Zürich", "São"),
]
_SYLLABLES = ("ka", "to", "ri", "men", "sa", "lo", "ve", "dun", "pa", "shi", "gor", "el", "an", "tri", "mo")
_generator = random.Random(16)
VOCABULARY = _COMMON + [
    "".join(_generator.choices(_SYLLABLES, k=_generator.randint(1, 4))) for _ in range(5_000)
]
_CUMULATIVE = list(itertools.accumulate(1 / (rank + 1) for rank in range(len(VOCABULARY))))  # Zipf
# Zipf-distributed words drawn once; a text is a random stretch of them (drawing each word is 10x slower).
_WORDS = _generator.choices(VOCABULARY, cum_weights=_CUMULATIVE, k=200_000)
_SOURCES = ("web", "ios", "android", "api", "slack")
_MODELS = ("gpt-4o-mini", "gpt-4o", "claude-3-5-haiku", "llama-3.1-70b")
_TAGS = ("travel", "billing", "follow-up", "urgent", "refund", "itinerary")


def chat_text(rng: random.Random, words: int) -> str:
    """``words`` words in sentences of twelve, capitalised and ended with a full stop."""
    start = rng.randrange(len(_WORDS) - words)
    picked = _WORDS[start : start + words]
    sentences = (" ".join(picked[start : start + 12]) for start in range(0, words, 12))
    return " ".join(f"{sentence[:1].upper()}{sentence[1:]}." for sentence in sentences)


def _meta(rng: random.Random, index: int, role: str) -> dict[str, Any]:
    meta: dict[str, Any]
    if role == "user":
        meta = {
            "source": rng.choice(_SOURCES),
            "turn": index // 2,
            "client_id": f"m-{rng.getrandbits(40):010x}",
        }
    else:
        meta = {
            "model": rng.choice(_MODELS),
            "turn": index // 2,
            "latency_ms": rng.randint(120, 9_000),
            "usage": {"prompt_tokens": rng.randint(200, 8_000), "completion_tokens": rng.randint(5, 600)},
            "temperature": rng.choice((0.0, 0.2, 0.7, 1.0)),
        }
    if rng.random() < 0.2:
        meta["tags"] = rng.sample(_TAGS, k=rng.randint(1, 3))
    return meta


def make_messages(count: int, start: int = 0) -> list[dict[str, Any]]:
    """Messages ``start`` to ``start + count`` of the benchmark chat, as dicts.

    Even indexes are user turns (3-60 words), odd ones assistant turns
    (20-340 words); each carries its own ``meta``.
    """
    rng = random.Random(start)
    messages = []
    for index in range(start, start + count):
        role = "user" if index % 2 == 0 else "assistant"
        words = rng.randint(3, 60) if role == "user" else rng.randint(20, 340)
        messages.append({"role": role, "content": chat_text(rng, words), "meta": _meta(rng, index, role)})
    return messages


def as_models(messages: Sequence[Mapping[str, Any]]) -> list[Message]:
    """``Message`` objects for ``messages``, built the way a caller builds them."""
    return [Message(**message) for message in messages]
