"""Errors an operator sees when a policy or selector cannot be saved.

Both carry the 1-based line and column of the offending spot so that the console
can point at it; ``str(error)`` is a complete sentence ending with the position.
"""

from __future__ import annotations


class PolicySyntaxError(ValueError):
    """The text is not a valid policy or selector.

    ``reason`` is the message without position, ``line``/``column`` are 1-based.
    """

    def __init__(self, reason: str, line: int, column: int) -> None:
        self.reason = reason
        self.line = line
        self.column = column
        super().__init__(f"{reason} at line {line}, column {column}")

    @property
    def message(self) -> str:
        """The full operator-facing message, position included."""
        return str(self)


class PolicyTypeError(PolicySyntaxError):
    """The text parses, but a literal does not fit the declared attribute type.

    A subclass of PolicySyntaxError so that callers catching syntax errors also
    refuse badly typed policies: both mean "cannot be saved as written".
    """
