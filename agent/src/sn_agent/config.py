"""The agent's configuration file (TOML; docs/agent.md), read and checked in full.

Every mistake is a ConfigError naming the key where it is (`actions.shutdown.timeout_s`)
and what is expected there: an agent that starts has a configuration it can use.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from sn_agent import expressions, signatures
from sn_agent.client import ACTS_ON_ANYTHING, ACTS_ON_NOTHING, ACTS_ON_SIGNED

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.9 and 3.10
    import tomli as tomllib

ATTRIBUTE_TYPES = ("string", "int", "float", "bool", "version")
TOP_LEVEL_KEYS = ("url", "token_file", "state_dir", "policy_file", "attributes", "providers")
TOP_LEVEL_KEYS += ("actions", "answer_without_action", "trust", "insecure_accept_unsigned")
TOP_LEVEL_KEYS += ("action_user",)
TRUST_KEYS = ("authorities",)
PROVIDER_KEYS = ("command", "file", "interval_s", "type", "field", "timeout_s")
ACTION_KEYS = ("command", "timeout_s", "user", "cwd", "env", "idempotent")
DEFAULT_ACTION_TIMEOUT_S = 60.0
DEFAULT_PROVIDER_TIMEOUT_S = 10.0
# Who an action without `user` runs as when the agent runs as root: nobody with a say
# over the server. An action that needs root says `user = "root"`, and check-config
# names it.
DEFAULT_ACTION_USER = "nobody"
ROOT = "root"


class ConfigError(Exception):
    """A configuration that cannot be used: `where` is the key (or the file)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.message = message


@dataclass(frozen=True)
class Provider:
    """An attribute measured on this server: a command's output or a file's content,
    read every `interval_s` seconds (one whitespace-separated `field` of it, if given)."""

    name: str
    type: str
    interval_s: float
    command: Optional[Tuple[str, ...]] = None
    file: Optional[Path] = None
    field: Optional[int] = None
    timeout_s: float = DEFAULT_PROVIDER_TIMEOUT_S


@dataclass(frozen=True)
class Action:
    """What the agent runs when a notification's content asks for `name`."""

    name: str
    command: Tuple[str, ...]
    timeout_s: float = DEFAULT_ACTION_TIMEOUT_S
    user: Optional[str] = None
    cwd: Optional[Path] = None
    env: Tuple[str, ...] = ()
    idempotent: bool = False


@dataclass(frozen=True)
class Config:
    """One agent's configuration, as checked."""

    source: Path
    url: str
    token_file: Path
    state_dir: Path
    policy_file: Optional[Path] = None
    attributes: Dict[str, Any] = field(default_factory=dict)
    providers: Dict[str, Provider] = field(default_factory=dict)
    actions: Dict[str, Action] = field(default_factory=dict)
    # A notification without an action is confirmed; with this, also answered `ok`.
    answer_without_action: bool = False
    # [trust]: the authorities whose attestations this agent believes, each with its
    # public keys (sn_agent.signatures). Set, the agent acts only on events whose
    # sender's signature and attestations hold; None: it checks no signature.
    authorities: Optional[Dict[str, Tuple[str, ...]]] = None
    # Without [trust]: act on events nobody signed (the console's word alone). Off by
    # default: whoever writes the console's database could then run every action here.
    insecure_accept_unsigned: bool = False

    @property
    def verifies(self) -> bool:
        """Whether notifications must carry a seal that holds before anything is run."""
        return self.authorities is not None

    @property
    def acts_on(self) -> str:
        """What this agent acts on: ACTS_ON_SIGNED, ACTS_ON_ANYTHING or ACTS_ON_NOTHING."""
        if self.verifies:
            return ACTS_ON_SIGNED
        return ACTS_ON_ANYTHING if self.insecure_accept_unsigned else ACTS_ON_NOTHING

    def as_root(self) -> List[str]:
        """The actions that run as root, by name."""
        return [name for name, action in self.actions.items() if action.user == ROOT]

    def token(self) -> str:
        """The token, read from `token_file` (checked again: it may have changed)."""
        return read_token(self.token_file)

    def policy_test(self) -> Optional[expressions.Test]:
        """The policy, compiled by the agent's own evaluator (ConfigError if it does not
        parse): what a verifying agent checks each event against (None: it does not
        verify)."""
        if not self.verifies:
            return None
        try:
            return expressions.policy_test(self.policy() or "")
        except expressions.ExpressionError as error:
            raise ConfigError("policy_file", f"not a policy: {error}") from None

    def policy(self) -> Optional[str]:
        """The connectivity policy's text, if a policy file is set."""
        if self.policy_file is None:
            return None
        try:
            return self.policy_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise ConfigError("policy_file", f"cannot read {self.policy_file}: {error}") from None


def load(path: Path | str) -> Config:
    """Read and check the configuration file at `path`; raise ConfigError if unusable."""
    path = Path(path)
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as error:
        raise ConfigError(str(path), f"cannot read: {error.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(str(path), f"not valid TOML: {error}") from None
    return from_dict(data, source=path)


def from_dict(data: dict, *, source: Path, euid: Optional[int] = None) -> Config:
    """Check parsed TOML (relative paths are taken from the file's folder). `euid`
    (this process's by default) says whether the agent runs as root, which decides
    who an action without `user` runs as."""
    only_known(data, TOP_LEVEL_KEYS, where="")
    base = source.parent
    euid = os.geteuid() if euid is None else euid
    config = Config(
        source=source,
        url=websocket_url(data),
        token_file=path_value(data, "token_file", base, required=True),
        state_dir=path_value(data, "state_dir", base, required=True),
        policy_file=path_value(data, "policy_file", base),
        attributes=static_attributes(table(data, "attributes", "")),
        providers=providers(table(data, "providers", ""), base),
        actions=actions(table(data, "actions", ""), base, default_user=action_user(data, euid)),
        answer_without_action=flag(data, "answer_without_action", ""),
        authorities=trusted_authorities(data),
        insecure_accept_unsigned=flag(data, "insecure_accept_unsigned", ""),
    )
    if config.verifies and config.policy_file is None:
        raise ConfigError(
            "trust", "an agent that verifies checks events against its own policy: set policy_file"
        )
    if config.verifies and config.insecure_accept_unsigned:
        raise ConfigError(
            "insecure_accept_unsigned",
            "contradicts [trust], which acts only on signed events: remove one of them",
        )
    shared = sorted(set(config.attributes) & set(config.providers))
    if shared:
        raise ConfigError(f"providers.{shared[0]}", "is also a static value in [attributes]")
    return config


def action_user(data: dict, euid: int) -> Optional[str]:
    """Who an action without `user` runs as: `action_user` (DEFAULT_ACTION_USER unless
    set) when the agent runs as root, which alone can switch users; else the agent's
    own user (None), which is not root."""
    value = data.get("action_user", DEFAULT_ACTION_USER)
    if not isinstance(value, str) or not value:
        raise ConfigError("action_user", "expected a user name")
    return value if euid == 0 else None


def warnings(config: Config) -> List[str]:
    """What `check-config` and the start log flag without refusing the file: an agent
    that acts on unsigned events, one that will refuse every action, and the actions
    that run as root."""
    said = []
    configured = ", ".join(config.actions) or "none configured"
    if config.acts_on == ACTS_ON_ANYTHING:
        said.append(
            "insecure_accept_unsigned = true: this agent runs whatever the console's "
            "database says; anyone who can write it, or the Redis that carries its pushes, "
            f"can run its actions ({configured}). Set [trust] instead (docs/agent.md)"
        )
    elif config.acts_on == ACTS_ON_NOTHING and config.actions:
        said.append(
            f"no [trust]: every action ({configured}) will be refused, since no event can be "
            "verified; set [trust] (docs/agent.md), or insecure_accept_unsigned = true"
        )
    said.extend(f"actions.{name}: runs as root" for name in config.as_root())
    said.extend(unswitchable_users(config))
    return said


def unswitchable_users(config: Config) -> List[str]:
    """Actions naming a user the agent cannot switch to: only root can (checked as
    the user running this check, who should be the one running the agent)."""
    import pwd

    if os.geteuid() == 0:
        return []
    me = pwd.getpwuid(os.geteuid()).pw_name
    return [
        f"actions.{name}.user: the agent runs as {me}, not root, and cannot run it as {a.user}"
        for name, a in config.actions.items()
        if a.user not in (None, me)
    ]


def check(config: Config) -> list[str]:
    """What `check-config` verifies beyond the file itself: the token is readable and
    private, the policy readable, and each action's program exists. The problems."""
    problems = []
    programs = partial(check_programs, config)
    for attempt in (config.token, config.policy, programs, config.policy_test):
        try:
            attempt()
        except ConfigError as error:
            problems.append(str(error))
    return problems


def read_token(path: Path) -> str:
    """The token in `path`, refused when others may read or write the file."""
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                "token_file",
                f"{path} is open to its group or to others (mode {stat.filemode(mode)}); "
                f"run: chmod 600 {path}",
            )
        token = path.read_text(encoding="utf-8").strip()
    except OSError as error:
        raise ConfigError("token_file", f"cannot read {path}: {error.strerror}") from None
    if not token:
        raise ConfigError("token_file", f"{path} is empty")
    return token


def check_programs(config: Config) -> None:
    """Each action's program exists here, and its user if it names one."""
    import pwd

    for action in config.actions.values():
        if action.user is not None:
            try:
                pwd.getpwnam(action.user)
            except KeyError:
                raise ConfigError(f"actions.{action.name}.user", "no such user here") from None
        program = action.command[0]
        if shutil.which(program) is None:
            where = f"actions.{action.name}.command"
            raise ConfigError(where, f"{program!r} is not an executable program here")


# The parts ----------------------------------------------------------------------------


def websocket_url(data: dict) -> str:
    url = data.get("url")
    if not isinstance(url, str) or not url.startswith(("ws://", "wss://")):
        raise ConfigError("url", "expected the console's agent address, ws://... or wss://...")
    return url


def path_value(data: dict, key: str, base: Path, *, required: bool = False, where: str = ""):
    where = where or key
    value = data.get(key)
    if value is None:
        if required:
            raise ConfigError(where, "is required (a path)")
        return None
    if not isinstance(value, str) or not value:
        raise ConfigError(where, "expected a path (a string)")
    return base / os.path.expanduser(value)


def table(data: dict, key: str, prefix: str) -> dict:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(prefix + key, "expected a table ([" + prefix + key + "])")
    return value


def only_known(data: dict, known: tuple, *, where: str) -> None:
    for key in data:
        if key not in known:
            at = f"{where}.{key}" if where else key
            raise ConfigError(at, f"unknown key; expected one of: {', '.join(known)}")


def static_attributes(values: dict) -> dict:
    for name, value in values.items():
        if isinstance(value, (bool, str, int, float)):
            continue
        raise ConfigError(f"attributes.{name}", "expected a string, number or true/false")
    return dict(values)


def trusted_authorities(data: dict) -> Optional[Dict[str, Tuple[str, ...]]]:
    """[trust] authorities = { NAME = ["ed25519:...", ...] }, each key checked."""
    if "trust" not in data:
        return None
    spec = checked_table(data["trust"], TRUST_KEYS, "trust")
    given = spec.get("authorities")
    if not isinstance(given, dict) or not given:
        raise ConfigError(
            "trust.authorities",
            'expected a table of authorities and their keys: { inventory = ["ed25519:..."] }',
        )
    return {name: authority_keys(name, keys) for name, keys in given.items()}


def authority_keys(name: str, keys: Any) -> Tuple[str, ...]:
    where = f"trust.authorities.{name}"
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        raise ConfigError(where, "expected a list of public keys (several while one rotates)")
    try:
        return signatures.trusted_keys(keys)
    except ValueError as error:
        raise ConfigError(where, str(error)) from None


def providers(tables: dict, base: Path) -> dict:
    return {name: provider(name, spec, base) for name, spec in tables.items()}


def checked_table(spec: Any, keys: tuple, where: str) -> dict:
    """`spec`, which must be a table holding only `keys`."""
    if not isinstance(spec, dict):
        raise ConfigError(where, "expected a table")
    only_known(spec, keys, where=where)
    return spec


def provider(name: str, spec: Any, base: Path) -> Provider:
    where = f"providers.{name}"
    spec = checked_table(spec, PROVIDER_KEYS, where)
    if ("command" in spec) == ("file" in spec):
        raise ConfigError(where, "needs exactly one of command (an argv list) or file")
    kind = spec.get("type")
    if kind not in ATTRIBUTE_TYPES:
        raise ConfigError(f"{where}.type", f"expected one of: {', '.join(ATTRIBUTE_TYPES)}")
    return Provider(
        name=name,
        type=kind,
        interval_s=seconds(spec, "interval_s", where, required=True),
        command=argv(spec, where) if "command" in spec else None,
        file=path_value(spec, "file", base, where=f"{where}.file"),
        field=whitespace_field(spec, where),
        timeout_s=seconds(spec, "timeout_s", where, default=DEFAULT_PROVIDER_TIMEOUT_S),
    )


def whitespace_field(spec: dict, where: str) -> Optional[int]:
    value = spec.get("field")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}.field", "expected a whole number from 1 (the first field)")
    return value


def actions(tables: dict, base: Path, *, default_user: Optional[str]) -> dict:
    return {
        name: action(name, spec, base, default_user=default_user) for name, spec in tables.items()
    }


def action(name: str, spec: Any, base: Path, *, default_user: Optional[str]) -> Action:
    where = f"actions.{name}"
    spec = checked_table(spec, ACTION_KEYS, where)
    user = spec.get("user", default_user)
    if user is not None and (not isinstance(user, str) or not user):
        raise ConfigError(f"{where}.user", "expected a user name")
    return Action(
        name=name,
        command=argv(spec, where),
        timeout_s=seconds(spec, "timeout_s", where, default=DEFAULT_ACTION_TIMEOUT_S),
        user=user,
        cwd=path_value(spec, "cwd", base, where=f"{where}.cwd"),
        env=names(spec, where),
        idempotent=flag(spec, "idempotent", where),
    )


def flag(spec: dict, key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"{where}.{key}" if where else key, "expected true or false")
    return value


def argv(spec: dict, where: str) -> Tuple[str, ...]:
    value = spec.get("command")
    is_argv = isinstance(value, list) and value and all(isinstance(a, str) for a in value)
    if not is_argv or not value[0]:
        raise ConfigError(
            f"{where}.command",
            'expected an argv list such as ["/usr/sbin/apachectl", "stop"] (never a shell line)',
        )
    return tuple(value)


def names(spec: dict, where: str) -> Tuple[str, ...]:
    value = spec.get("env", [])
    if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
        raise ConfigError(f"{where}.env", "expected a list of variable names to pass on")
    return tuple(value)


def seconds(spec: dict, key: str, where: str, *, required=False, default=None) -> float:
    value = spec.get(key, default)
    if value is None and required:
        raise ConfigError(f"{where}.{key}", "is required (seconds)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise ConfigError(f"{where}.{key}", "expected seconds, more than 0 and at most 86400")
    return float(value)
