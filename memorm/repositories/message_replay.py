"""Retried appends: a batch that is already stored comes back as stored, not twice.

A server whose `COMMIT` acknowledgement was lost (the connection broke after
the statement was sent) cannot know whether the append landed.  Run again
with the same message ids, it must not store the messages twice:
[`MessageRepository.append`][memorm.repositories.MessageRepository.append]
then returns the stored messages and writes nothing.

A batch counts as already stored when every one of its messages is stored
under its id, in the session appended to, in the batch's order, and is *the
same message*:

* `role`, `content`, `name`, `tool_calls`, `tool_call_id` and `meta` equal,
  JSON values compared with their types (`1`, `1.0` and `True` differ; a
  tuple equals the list it was stored as);
* `token_count` equal when the retry gives it; when it does not, the first
  attempt's estimate stands (a token counter may have changed in between).
  `created_at` is not compared: a `Message` built anew for the retry has a
  new one, and the first attempt's time stands.

Anything else with a stored id (another content, another session, another
agent's, only part of the batch stored) is a `ConflictError`, raised before
anything is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from memorm.errors import ConflictError
from memorm.models import Message
from memorm.repositories.message_input import MessageInput
from memorm.repositories.message_queries import _COLUMNS

__all__ = ["replay", "same_json"]

_COMPARED = ("role", "content", "name", "tool_call_id")  # plain values
_COMPARED_JSON = ("tool_calls", "meta")
_IF_GIVEN = ("token_count",)  # compared only when the retry gives them


def replay(
    session_id: uuid.UUID,
    batch: Sequence[MessageInput],
    rows: Sequence[dict[str, Any]],
    stored: Mapping[uuid.UUID, Message],
) -> list[Message] | None:
    """The stored messages, when `rows` (checked, of `batch`) are already stored as the same batch.

    `stored`: the tenant's stored messages with the batch's ids, any
    agent's.  None when no message of the batch is stored; `ConflictError`
    when some are but the batch is not the one stored (see the module's
    docstring): an id stored in another session first, since no retry
    settles that.
    `Message` inputs are filled in from the stored rows, as a first append
    fills them in.
    """
    found = [stored.get(row["id"]) for row in rows]
    if all(message is None for message in found):
        return None
    for index, (row, message) in enumerate(zip(rows, found, strict=True)):
        if message is not None and message.session_id != session_id:  # another agent's too
            raise ConflictError(
                f"messages[{index}]: a message with id {row['id']} is stored in another session"
            )
    for index, (item, row, message) in enumerate(zip(batch, rows, found, strict=True)):
        where = f"messages[{index}]: a message with id {row['id']}"
        if message is None:
            first = next(at for at, other in enumerate(found) if other is not None)
            raise ConflictError(
                f"{where} is not stored, but messages[{first}] is: "
                "a retried append must send the batch it first sent"
            )
        different = _difference(item, row, message)
        if different is not None:
            raise ConflictError(f"{where} is stored with another {different}")
    seqs = [message.seq for message in found if message is not None]
    if seqs != sorted(seqs):
        raise ConflictError("the batch's messages are stored in another order")
    replayed: list[Message] = []
    for item, message in zip(batch, found, strict=True):
        assert message is not None
        if isinstance(item, Message):
            item.__dict__.update({name: message.__dict__[name] for name in _COLUMNS})
            replayed.append(item)
        else:
            replayed.append(message)
    return replayed


def _difference(item: MessageInput, row: Mapping[str, Any], message: Message) -> str | None:
    """The first field in which the checked `row` (of input `item`) differs from the stored `message`."""
    for name in _COMPARED:
        if row[name] != message.__dict__[name]:
            return name
    for name in _COMPARED_JSON:
        if not same_json(row[name], message.__dict__[name]):
            return name
    given = item.__dict__ if isinstance(item, Message) else item
    for name in _IF_GIVEN:
        # The caller's own value: the checked row has a default filled in by now.
        if given.get(name) is not None and row[name] != message.__dict__[name]:
            return name
    return None


def same_json(given: Any, stored: Any) -> bool:
    """Whether a checked JSON value and one read back from the database are the same value.

    Types count (`1`, `1.0` and `True` differ, though Python's `==` says
    otherwise); a tuple is the list it is stored as.
    """
    if isinstance(given, Mapping):
        return (
            isinstance(stored, Mapping)
            and given.keys() == stored.keys()
            and all(same_json(value, stored[key]) for key, value in given.items())
        )
    if isinstance(given, (list, tuple)):
        return isinstance(stored, list) and len(given) == len(stored) and all(map(same_json, given, stored))
    return _kind(given) is _kind(stored) and given == stored


def _kind(value: Any) -> type:
    """The JSON kind of a scalar (bool before int: `True` is an int to Python)."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind
    return type(value)
