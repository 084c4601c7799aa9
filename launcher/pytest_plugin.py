"""The test run's environment, set up before Django loads, so that plain `pytest` and
`./test` run the same way (loaded by `-p launcher.pytest_plugin` in pyproject.toml).

- Tests that are pure Python (`tests/policies`, the language and matcher, which import
  no Django) run without Django and without any server: `pytest tests/policies`.
- Any other run gets the settings the tests rely on (short agent and Celery timings,
  a throwaway SECRET_KEY) unless the environment sets them, and private PostgreSQL and
  Redis servers under var/test/ (started here, stopped at the end) unless DATABASE_URL
  and REDIS_URL name servers already running. Two test runs in one checkout share
  them: each holds var/test's lock shared (launcher.folder_lock), and the last one out
  stops them. Static files are collected again only when they changed since the last
  run.
- Run in parallel (`pytest -n N`, as ./test does), each test process gets a Redis
  database and, when the run started its own, a PostgreSQL server of its own.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest
from pytest_django.lazy_django import django_settings_is_configured

from launcher.embedded import PrivateServers
from launcher.folder_lock import FolderInUse, FolderLock, hold_shared, holder_description

ROOT = Path(__file__).resolve().parent.parent
TEST_DATA = ROOT / "var" / "test"
# Test paths that need neither Django nor a server.
PURE_PATHS = (ROOT / "tests" / "policies",)
TEST_SETTINGS = {
    "STATIC_ROOT": str(TEST_DATA / "static"),
    # Tasks of a worker a test kills are handed out again after this many seconds.
    "CELERY_VISIBILITY_S": "8",
    # The agent-socket test of the login deadline waits this long.
    "AGENT_LOGIN_TIMEOUT_S": "2",
    # Agents confirm, and are sent what they lack, within seconds rather than tens.
    "AGENT_HEARTBEAT_S": "2",
    "AGENT_REDELIVER_AFTER_S": "2",
    # The tree settles after a change within a tenth of a second rather than one.
    "TREE_FRESH_FOR_MS": "50",
    # A leaf that just took in changes gathers the next ones for a tenth of a second.
    "TREE_CHANGES_GATHER_MS": "100",
    # And a web process its agents' updates and presence for a fiftieth of a second.
    "AGENT_REPORTS_GATHER_MS": "20",
}
# A run that is stopping its servers holds the folder alone for the few seconds it takes.
FOLDER_WAIT_S = 60.0
_servers: PrivateServers | None = None
_lock: FolderLock | None = None
_signing_keys: Path | None = None


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    """Before pytest-django reads the settings (its own hook of this name)."""
    if only_pure_tests(early_config, parser.parse_known_args(args).file_or_dir):
        # pytest-django takes an empty DJANGO_SETTINGS_MODULE for "no Django here"; set
        # even when inherited (the launcher's own imports set it, through Celery's app).
        os.environ["DJANGO_SETTINGS_MODULE"] = ""
    else:
        provide_test_environment(os.environ)
    return (yield)


def only_pure_tests(config, paths: list[str]) -> bool:
    """Whether every test path asked for (or, if none, every test path configured)
    lies inside one of PURE_PATHS."""
    chosen = paths or config.getini("testpaths")
    resolved = [(Path(config.invocation_params.dir) / p.split("::")[0]).resolve() for p in chosen]
    return bool(resolved) and all(
        any(path.is_relative_to(pure) for pure in PURE_PATHS) for path in resolved
    )


def provide_test_environment(env) -> None:
    """Fill in the tests' settings and servers wherever `env` leaves them unset."""
    global _servers
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    for name, value in TEST_SETTINGS.items():
        env.setdefault(name, value)
    if not env.get("DATABASE_URL") or not env.get("REDIS_URL"):
        if not env.get("DATABASE_URL"):
            env[PRIVATE_POSTGRES] = "1"
        _servers = private_servers(TEST_DATA)
        _servers.provide(env)  # starts what is missing and sets its URL in `env`
    if env.get(XDIST_WORKER):  # one of several processes running the tests (pytest -n N)
        keep_apart(env, env[XDIST_WORKER])
    # A worker inherits the main process's folder: it gets one of its own instead.
    if env.get("SIGNING_KEYS_DIR") in (None, "", env.get(OWN_SIGNING_KEYS)):
        env["SIGNING_KEYS_DIR"] = env[OWN_SIGNING_KEYS] = str(signing_keys_dir(env))


def private_servers(folder: Path) -> PrivateServers:
    """The private servers of `folder`, once this run shares the folder's lock with the
    other test runs (a `./run` or `services` on it is refused, and refuses them)."""
    global _lock
    try:
        _lock = hold_shared(folder, holder_description("a test run"), wait_s=FOLDER_WAIT_S)
    except FolderInUse as error:
        raise pytest.UsageError(str(error)) from None
    return PrivateServers(folder)


def signing_keys_dir(env) -> Path:
    """A new folder for the console's signing keys of this test process (its web server
    and worker read the same), removed when it ends: tests of other processes, and of
    another run at once, make keys of the same names, and every rotation keeps the old
    key aside (broker.services.signing_keys)."""
    global _signing_keys
    process = env.get(XDIST_WORKER, "main")
    _signing_keys = TEST_DATA / "signing-keys" / f"{process}-{os.getpid()}"
    shutil.rmtree(_signing_keys, ignore_errors=True)  # of a process long gone, same pid
    _signing_keys.mkdir(mode=0o700, parents=True)
    return _signing_keys


def keep_apart(env, worker: str) -> None:
    """Give this test process a Redis database and, when the run started its own
    PostgreSQL, a PostgreSQL server of its own. A database of its own on a shared
    server would not do: the tree's leaves and the reports' export read the server's
    oldest running transaction, which every database of a server shares, so another
    process's long transaction would hold this one's work back."""
    global _servers
    keep_apart_in_redis(env, worker)
    if env.get(PRIVATE_POSTGRES):
        del env["DATABASE_URL"]
        _servers = private_servers(TEST_DATA / worker)
        _servers.provide(env)  # PostgreSQL alone: REDIS_URL is set


# Set by pytest-xdist in each of the processes it runs the tests in: gw0, gw1...
XDIST_WORKER = "PYTEST_XDIST_WORKER"
# Set by this plugin when the run started its own PostgreSQL, for its other processes.
PRIVATE_POSTGRES = "SN_TESTS_PRIVATE_POSTGRES"
# The SIGNING_KEYS_DIR this plugin made, which a process it starts makes anew for itself.
OWN_SIGNING_KEYS = "SN_TESTS_OWN_SIGNING_KEYS"
REDIS_URLS = ("REDIS_URL", "CHANNEL_LAYER_URL", "CELERY_BROKER_URL")


def keep_apart_in_redis(env, worker: str) -> None:
    """Give this test process a Redis database of its own (gw0 -> 1, gw1 -> 2, ...):
    queues, hop streams and channel-layer groups of two processes must never meet."""
    index = int(worker.removeprefix("gw")) + 1
    for name in REDIS_URLS:
        if env.get(name):
            env[name] = with_redis_database(env[name], index)


def with_redis_database(url: str, index: int) -> str:
    """`url` (redis://, rediss:// or unix://) choosing database `index`."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        query = [(k, v) for k, v in parse_qsl(parts.query) if k != "db"] + [("db", str(index))]
        return f"unix://{parts.netloc}{parts.path}?{urlencode(query)}"
    return urlunsplit(parts._replace(path=f"/{index}"))


def pytest_configure(config) -> None:
    if django_settings_is_configured():
        collect_static_if_changed()


def pytest_unconfigure(config) -> None:
    if _signing_keys is not None:
        shutil.rmtree(_signing_keys, ignore_errors=True)
    if _servers is None:
        return
    if django_settings_is_configured():
        from broker.push.to_consoles import settle

        settle()  # what the tests announced last is sent before Redis goes
    stop_servers_if_last()


def stop_servers_if_last() -> None:
    """Stop the private servers if no other test run shares them (whoever started
    them: a run that adopted them may be the last); otherwise leave them to the last."""
    if _lock.take_alone():
        _servers.stop()
    _lock.release()


def collect_static_if_changed() -> None:
    """Run collectstatic when the static files differ from those collected last."""
    from django.conf import settings
    from django.core.management import call_command

    stamp_file = Path(settings.STATIC_ROOT) / ".collected-from"
    stamp = static_sources_stamp()
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return
    call_command("collectstatic", interactive=False, verbosity=0)
    stamp_file.write_text(stamp)


def static_sources_stamp() -> str:
    """A digest of every file collectstatic would read (name, size, time of change)."""
    from django.contrib.staticfiles.finders import get_finders

    digest = hashlib.sha256()
    for finder in get_finders():
        for path, storage in finder.list(ignore_patterns=[]):
            stat = os.stat(storage.path(path))
            digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
