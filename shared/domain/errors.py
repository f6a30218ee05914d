"""Errors every layer shares, and the small readers that raise them with a field path."""

from __future__ import annotations


class MtcError(Exception):
    """Base of mtc's own errors."""


class PermanentError(MtcError):
    """Retrying cannot help: the event goes to the dead-letter topic, the request gets a 4xx."""


class TransientError(MtcError):
    """Retrying may help: the function answers 500 so the message is redelivered."""


class StateError(PermanentError):
    """A state file that cannot be used as it is (damaged, unreadable, not writable): the
    message names the file and what to do, and nothing is started over it."""


class StorageFull(TransientError):
    """The state storage cannot take a write (the disk or the database is full): nothing of
    the write was kept, and the same call succeeds once space returns. The message names
    where the state lives."""


class ValidationError(PermanentError):
    """Bad input: names the field path and the reason."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def nested(self, prefix: str) -> ValidationError:
        return ValidationError(f"{prefix}.{self.path}" if self.path else prefix, self.reason)


class InvalidTransition(PermanentError):
    def __init__(self, entity: str, entity_id: str, current: str, target: str) -> None:
        super().__init__(f"{entity} {entity_id}: cannot go from {current} to {target}")
        self.entity = entity
        self.entity_id = entity_id
        self.current = current
        self.target = target


class NotFound(PermanentError):
    def __init__(self, entity: str, entity_id: str) -> None:
        super().__init__(f"{entity} {entity_id} not found")
        self.entity = entity
        self.entity_id = entity_id


class Conflict(PermanentError):
    """The request contradicts current state (e.g. a cluster id already taken)."""
