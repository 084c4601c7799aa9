"""Attributes measured on the server: a command's output or a file's content, read on
an interval and typed as the console's vocabulary types them (docs/addressing.md)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from sn_agent.config import Provider

VERSION = re.compile(r"^\d+(\.\d+)*$")
TRUE_WORDS = {"true", "yes", "on", "1"}
FALSE_WORDS = {"false", "no", "off", "0"}
MAX_READ_BYTES = 64 * 1024


class ProviderError(Exception):
    """A reading that gave no value (the command failed, the text is not of the type)."""


async def measure(provider: Provider) -> Any:
    """One reading of `provider`, typed; raise ProviderError if there is none."""
    text = await _read(provider)
    if provider.field is not None:
        fields = text.split()
        if len(fields) < provider.field:
            raise ProviderError(f"has {len(fields)} fields, not {provider.field}: {text[:80]!r}")
        text = fields[provider.field - 1]
    return typed(text.strip(), provider.type)


def typed(text: str, kind: str) -> Any:
    """`text` as a value of `kind` (one of config.ATTRIBUTE_TYPES)."""
    try:
        return _CONVERSIONS[kind](text)
    except ValueError:
        raise ProviderError(f"{text[:80]!r} is not a {kind}") from None


def _float(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(text)
    return value


def _bool(text: str) -> bool:
    word = text.lower()
    if word in TRUE_WORDS or word in FALSE_WORDS:
        return word in TRUE_WORDS
    raise ValueError(text)


def _version(text: str) -> str:
    if not VERSION.match(text):
        raise ValueError(text)
    return text


def _string(text: str) -> str:
    if not text:
        raise ValueError(text)
    return text


_CONVERSIONS = {"string": _string, "int": int, "float": _float, "bool": _bool}
_CONVERSIONS["version"] = _version


async def _read(provider: Provider) -> str:
    if provider.file is not None:
        try:
            with open(provider.file, "rb") as file:
                return file.read(MAX_READ_BYTES).decode("utf-8", errors="replace")
        except OSError as error:
            raise ProviderError(f"cannot read {provider.file}: {error.strerror}") from None
    return await _run(provider)


async def _run(provider: Provider) -> str:
    try:
        process = await asyncio.create_subprocess_exec(
            *provider.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
    except OSError as error:
        raise ProviderError(f"cannot run {provider.command[0]}: {error.strerror}") from None
    try:
        output, _ = await asyncio.wait_for(process.communicate(), provider.timeout_s)
    except asyncio.TimeoutError:
        process.kill()
        await process.wait()
        raise ProviderError(f"gave no answer within {provider.timeout_s:g} s") from None
    if process.returncode != 0:
        raise ProviderError(f"exited with {process.returncode}")
    return output[:MAX_READ_BYTES].decode("utf-8", errors="replace")
