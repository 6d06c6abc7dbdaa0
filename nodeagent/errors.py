"""One exception root for nodeagent; each subclass names what the caller can do about it."""

from __future__ import annotations


class NodeagentError(Exception):
    """Root of every error nodeagent raises on purpose."""


class ConfigError(NodeagentError):
    """The configuration is invalid: fix the named key. Daemons exit 78 (EX_CONFIG) on it."""

    def __init__(self, key: str, problem: str) -> None:
        self.key = key
        self.problem = problem
        super().__init__(f"{key}: {problem}" if key else problem)


class UsageError(NodeagentError):
    """A command-line request that can never succeed as given (e.g. scale outside bounds)."""


class NotFoundError(UsageError):
    """A job or node named on the command line does not exist (nodeagentctl exits 3)."""


class RefusedError(UsageError):
    """Who asked may not have it: a node's agent answered 401 or 403 (`status`), which the
    API answers in turn (nodeagentctl exits 2, as for any refusal)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class CoordinationError(NodeagentError):
    """Redis could not be reached or answered unexpectedly; retrying later may succeed."""


class FencedError(CoordinationError):
    """A fenced write was refused: this agent is no longer leader or its view is stale."""


class CorruptStateError(CoordinationError):
    """A value read from Redis is not what nodeagent writes there (garbage, foreign writer)."""


class AccountingError(CoordinationError):
    """The accounting database could not be reached or answered unexpectedly (the pool's
    records wait in Redis meanwhile); retrying later may succeed."""


class IllegalTransition(NodeagentError):
    """A state machine was asked to make a transition its table does not allow (a bug)."""
