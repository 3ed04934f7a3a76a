"""One repository per aggregate; each flushes, none commits."""

from memorm.repositories.agents import AgentRepository
from memorm.repositories.checkpoints import CheckpointRepository
from memorm.repositories.messages import MessageRepository
from memorm.repositories.passages import PassageRepository
from memorm.repositories.sessions import SessionRepository
from memorm.repositories.store import StoreRepository

__all__ = [
    "AgentRepository",
    "CheckpointRepository",
    "MessageRepository",
    "PassageRepository",
    "SessionRepository",
    "StoreRepository",
]
