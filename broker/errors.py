"""Errors the event service raises when it refuses something. Each says what is wrong
and where (`field`), in words an operator or agent developer understands."""

from __future__ import annotations


class BrokerError(Exception):
    """Base of every refusal; `field` names the offending input when there is one."""

    code = "refused"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def as_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "field": self.field}


class InvalidInput(BrokerError):
    code = "invalid"


class NotAuthorised(BrokerError):
    code = "not_authorised"


class NotFound(BrokerError):
    code = "not_found"


class AuthenticationFailed(BrokerError):
    code = "authentication_failed"


class PolicyRejected(BrokerError):
    """A policy or selector that does not parse or type-check; carries the position."""

    code = "policy_rejected"

    def __init__(self, message: str, *, field: str, line: int, column: int) -> None:
        super().__init__(message, field=field)
        self.line = line
        self.column = column

    def as_dict(self) -> dict:
        return {**super().as_dict(), "line": self.line, "column": self.column}
