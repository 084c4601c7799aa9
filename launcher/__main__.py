"""`python -m launcher run|test|services`: see the package docstring and README."""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from console.env import ConfigurationError, env_int
from demo.data_folder import (
    default_data_dir,
    demo_keys_file,
    signing_keys_dir,
    write_demo_settings,
    write_new_private,
)
from launcher.embedded import PrivateServers
from launcher.folder_lock import FolderInUse, hold_alone, holder_description
from launcher.supervisor import Supervisor, listening_socket, say, web_server_argv
from reports import QUEUE as REPORTS_QUEUE

ROOT = Path(__file__).resolve().parent.parent
PYTEST_NO_TESTS_COLLECTED = 5
SECRET_KEY_FILE_NAME = "secret_key"
SPARK_LOG_FILE_NAME = "spark.log"


def persistent_secret_key(data_dir: Path) -> str:
    """A SECRET_KEY kept in the data folder, so sessions survive a restart: made once,
    as a new file readable by the user alone, and never replaced (sessions, second-factor
    proofs and password-reset links are signed with it). An empty one is refused."""
    path = data_dir / SECRET_KEY_FILE_NAME
    with contextlib.suppress(FileExistsError):
        write_new_private(path, secrets.token_urlsafe(50))
    key = path.read_text().strip()
    if not key:
        raise ConfigurationError(
            f"{path} is empty: put the secret key back in it, or remove it to have a new "
            "one made (everyone logged in is then logged out)"
        )
    return key


def fresh_metrics_dir(data_dir: Path) -> Path:
    """The folder where this run's processes write their /metrics figures
    (prometheus-client's multiprocess mode), emptied: a run's figures start at zero."""
    folder = data_dir / "metrics"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def manage(env: dict[str, str], *args: str, capture: bool = False) -> str:
    """Run a management command in a child process; stop the launcher if it fails."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        env=env,
        check=True,
        stdout=subprocess.PIPE if capture else None,
        text=True,
    )
    return (result.stdout or "").strip()


def start_console(
    supervisor: Supervisor,
    env: dict[str, str],
    *,
    host: str,
    port: int,
    queues: str,
    data_dir: Path,
    web_processes: int,
    worker_concurrency: int,
    verbose: bool = False,
) -> socket.socket:
    """Every role on this machine: `web_processes` web servers, a tree worker of
    `worker_concurrency` processes serving `queues` (the whole tree), the reports worker
    and the beat. Returns the web processes' listening socket, which the caller keeps
    open."""
    listener = start_web(supervisor, env, host=host, port=port, processes=web_processes,
                         verbose=verbose)  # fmt: skip
    start_tree_worker(supervisor, env, queues=queues, concurrency=worker_concurrency,
                      verbose=verbose)  # fmt: skip
    supervisor.start("reports", reports_worker_argv(verbose=verbose), env)
    start_beat(supervisor, env, data_dir=data_dir, verbose=verbose)
    return listener


def start_web(
    supervisor: Supervisor, env: dict[str, str], *, host: str, port: int, processes: int,
    verbose: bool = False,
) -> socket.socket:  # fmt: skip
    """`processes` web servers accepting from one listening socket on host:port: a push
    to a thousand agents is bound by one process's single thread, so it is split across
    cores. The launcher keeps its copy open (never accepting) to hand it to a restarted
    process; the caller closes it when it stops."""
    listener = listening_socket(host, port)
    web_server = web_server_argv(listener, verbose=verbose)
    for index in range(processes):
        name = "web" if processes == 1 else f"web{index + 1}"
        supervisor.start(name, web_server, env, pass_fds=(listener.fileno(),))
    return listener


def start_tree_worker(
    supervisor: Supervisor, env: dict[str, str], *, queues: str, concurrency: int,
    verbose: bool = False, name: str = "worker", node: str = "console@%h",
) -> None:  # fmt: skip
    """A Celery worker of `concurrency` processes serving `queues` (`manage.py
    worker_queues`: the whole tree, or a subtree), each process routing their hops.
    `node` is its Celery name, unique per host."""
    python_bin = Path(sys.executable).parent
    supervisor.start(
        name,
        [
            str(python_bin / "celery"), "-A", "console", *([] if verbose else ["--quiet"]),
            "worker", "--loglevel", "INFO" if verbose else "WARNING",
            "--concurrency", str(concurrency), "--without-gossip",
            "--without-mingle", "--hostname", node, "--queues", queues,
        ],
        env,
    )  # fmt: skip


def start_beat(
    supervisor: Supervisor, env: dict[str, str], *, data_dir: Path, verbose: bool = False
) -> None:
    """The beat: exactly one per deployment (two run every periodic task twice; the
    health page says so). Its schedule file lives in `data_dir`."""
    python_bin = Path(sys.executable).parent
    supervisor.start(
        "beat",
        [
            str(python_bin / "celery"), "-A", "console", *([] if verbose else ["--quiet"]),
            "beat", "--loglevel", "WARNING",
            "--schedule", str(data_dir / "celerybeat-schedule"),
        ],
        env,
    )  # fmt: skip


def reports_worker_argv(*, verbose: bool = False, hostname: str = "reports@%h") -> list[str]:
    """The reports worker: the reports queue alone, one report at a time in the worker's
    own process (`solo`), so that the SparkSession it starts stays warm for the next."""
    python_bin = Path(sys.executable).parent
    return [
        str(python_bin / "celery"), "-A", "console", *([] if verbose else ["--quiet"]),
        "worker", "--loglevel", "INFO" if verbose else "WARNING", "--pool", "solo",
        "--without-gossip", "--without-mingle", "--hostname", hostname,
        "--queues", REPORTS_QUEUE,
    ]  # fmt: skip


def connect_host(host: str) -> str:
    """Where to reach the console listening on `host` (a wildcard is reached on the
    loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "::") else host


def start_fleet(supervisor: Supervisor, env: dict[str, str], *, host: str, port: int, agents: int):
    """Simulated web servers on real sockets, so that the demo's fleet is alive."""
    if agents <= 0:
        return
    url = f"ws://{connect_host(host)}:{port}/ws/agent/v1/"
    argv = [sys.executable, str(ROOT / "manage.py"), "simulate_fleet", "--agents", str(agents)]
    argv += ["--processes", "1", "--url", url, "--load-interval", "10"]
    supervisor.start("fleet", argv, env)


def prepare_console(env: dict[str, str], data_dir: Path) -> tuple[str, list[str]]:
    """Migrate, collect static files, make sure of the scenario (its keys kept in the
    data folder), an admin, a user per role and the demo's incident; return the queues
    a worker must serve and what to tell about the logins (the users', the admin's)."""
    manage(env, "migrate", "--noinput", "-v", "0")
    manage(env, "collectstatic", "--noinput", "-v", "0")
    # Before any password is made: a keys file it may not replace stops the run here.
    manage(env, "load_scenario", "--keys-file", str(demo_keys_file(data_dir)), capture=True)
    logins: list[str] = []
    with said_if_a_step_fails(logins):
        logins.append(manage(env, "ensure_admin", capture=True))
        logins.insert(0, manage(env, "ensure_demo_users", capture=True))
        # A small incident for the report pages (once), and their first runs, so that no
        # report page of a fresh demo is empty; the reports worker runs them once started.
        manage(env, "generate_traffic", "--demo", capture=True)
        manage(env, "run_reports", "--if-never-run", capture=True)
        queues = manage(env, "worker_queues", capture=True)
    return queues, logins


@contextlib.contextmanager
def said_if_a_step_fails(logins: list[str]):
    """Say the `logins` made so far if a step fails: their passwords are shown once,
    and the next run, finding the users, makes none."""
    try:
        yield
    except subprocess.CalledProcessError:
        for login in logins:
            say(login)
        raise


def where_the_keys_are(data_dir: Path) -> str:
    """One line saying where the demo's authority and grant keys are, if they are known."""
    path = demo_keys_file(data_dir)
    if path.is_file():
        return f"authority and grant keys for the attestation API: {path} (see docs/console.md)"
    return f"authority keys unknown: this database's scenario was loaded before {path} was kept"


SERVING_TIMEOUT_S = 90.0


def wait_until_serving(host: str, port: int) -> None:
    """Until the health check passes (web, worker and channel layer all answer), or a
    while; the console is announced either way."""
    url = f"http://{connect_host(host)}:{port}/healthz.json"
    deadline = time.monotonic() + SERVING_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=10) as reply:
            if reply.status == 200:
                return
        time.sleep(0.5)


def command_run(args: argparse.Namespace) -> int:
    """Start services, prepare the database, then the web server and workers, and
    keep them all running until Ctrl-C or SIGTERM. A data folder another run or
    `services` holds is refused before anything starts (launcher.folder_lock)."""
    return holding_data_folder(args.data_dir, "./run", partial(run_console, args))


def holding_data_folder(data_dir: Path, command: str, serve: Callable[[], int]) -> int:
    """`serve()` while this process holds `data_dir` alone, as `command`; if another
    process holds it, 1 and one line saying which, with nothing started or stopped."""
    try:
        lock = hold_alone(data_dir, holder_description(command))
    except FolderInUse as error:
        say(str(error))
        return 1
    try:
        return serve()
    finally:
        lock.release()


def run_console(args: argparse.Namespace) -> int:
    """`command_run` once it holds the data folder."""
    data_dir = args.data_dir
    env = console_environment(data_dir, verbose=args.verbose)
    services = PrivateServers(data_dir)
    supervisor = Supervisor()
    supervisor.install_signal_handlers()
    listener = None
    try:
        services.provide(env)
        queues, logins = prepare_console(env, data_dir)
        listener = start_console(
            supervisor, env, host=args.host, port=args.port, queues=queues,
            data_dir=data_dir, web_processes=args.web_processes,
            worker_concurrency=args.worker_concurrency, verbose=args.verbose,
        )  # fmt: skip
        start_fleet(supervisor, env, host=args.host, port=args.port, agents=args.fleet)
        services.watch_with(supervisor)
        environment = write_demo_settings(data_dir, env)
        # Said last, once the processes' start-up lines are out, so that it stays in view.
        wait_until_serving(args.host, args.port)
        announce(args, data_dir, environment, logins)
        supervisor.wait()
        return 0
    finally:
        say("stopping")
        supervisor.stop_all()
        if listener is not None:
            listener.close()
        services.stop()
        say("stopped")


# Celery warns a worker run as root (a demo in a container often is), at each start of
# each worker, in 8 lines: under ./run, only when --verbose. Deployed roles keep it.
CELERY_ROOT_WARNING_IGNORED = "ignore:You're running the worker with superuser privileges:Warning"


def console_environment(data_dir: Path, *, verbose: bool) -> dict[str, str]:
    """The environment of the console's processes under `./run`: this one's, with the
    data folder's secret key and signing keys, quiet unless `verbose` (Spark's own
    lines go to DATA_DIR/spark.log), so that the console's address is its last line."""
    env = dict(os.environ)
    env.setdefault("SECRET_KEY", persistent_secret_key(data_dir))
    env.setdefault("SIGNING_KEYS_DIR", str(signing_keys_dir(data_dir)))
    if not verbose:
        env.setdefault("LOG_LEVEL", "WARNING")
        env.setdefault("SPARK_LOG_FILE", str(data_dir / SPARK_LOG_FILE_NAME))
        env.setdefault("PYTHONWARNINGS", CELERY_ROOT_WARNING_IGNORED)
    # The children's lines reach the launcher as they are written, not when a buffer
    # fills, nor never if a child is killed.
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(fresh_metrics_dir(data_dir)))
    return env


def announce(args: argparse.Namespace, data_dir: Path, environment: Path, logins) -> None:
    """What a user of the demo needs, the console's address last."""
    say(f"management commands beside it: .venv/bin/python manage.py ... (reads {environment})")
    say(where_the_keys_are(data_dir))
    say(
        "second factor of the demo users (all but the auditor) and the admin: "
        ".venv/bin/python manage.py demo_code USER prints the code to type"
    )
    for login in logins:  # the admin's password last but the address
        say(login)
    say(f"console at http://{args.host}:{args.port}/  (Ctrl-C stops everything)")


def command_test(args: argparse.Namespace) -> int:
    """Run the tests with pytest (launcher.pytest_plugin sets up their environment and
    servers): the fast tier in parallel processes; with --all, after installing the
    system packages the full tier needs (Chromium, Java), the full tier after it in
    one process."""
    fast_args = in_parallel(within_tier(args.pytest_args, FAST_TIER))
    if not args.all:
        # Property tests try 100 examples each instead of the full tier's 500.
        env = {"POLICIES_HYPOTHESIS_PROFILE": "policies-dev", **os.environ}
        codes = [pytest_run(fast_args, env)]
    else:
        subprocess.run([str(ROOT / "scripts" / "install-system-packages")], check=True)
        # In one process: each test of the full tier runs a whole stack (tree worker,
        # web, Spark) and allows it the time it takes on a machine doing nothing else;
        # two stacks on two cores miss those times (measured: 2 to 8 failures a run).
        # The slowest listed: the full tier has a budget (under 15 minutes with the fast).
        full_args = ["-n", "0", "--durations=25", *within_tier(args.pytest_args, FULL_TIER)]
        codes = [pytest_run(fast_args, dict(os.environ)), pytest_run(full_args, dict(os.environ))]
    ran = [code for code in codes if code != PYTEST_NO_TESTS_COLLECTED]
    if not ran:
        hint = "" if args.all else " (those of the full tier run with ./test --all)"
        say(f"no test was collected: that is a failure{hint}")
        return 1
    return max(ran)


def pytest_run(pytest_args: list[str], env: dict[str, str]) -> int:
    """Run pytest with these arguments in this environment; its exit code."""
    return subprocess.run([sys.executable, "-m", "pytest", *pytest_args], env=env).returncode


FAST_TIER = "not full"
FULL_TIER = "full"


def in_parallel(pytest_args: list[str]) -> list[str]:
    """`pytest_args` running the tests in as many processes as there are cores, a test
    module's tests in the same process (they share module-scoped set-ups), unless the
    arguments choose (`-n 0` runs them in this one process, for a debugger)."""
    chosen = any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in pytest_args)
    return pytest_args if chosen else ["-n", "auto", "--dist", "loadfile", *pytest_args]


def within_tier(pytest_args: list[str], tier: str) -> list[str]:
    """`pytest_args` selecting `tier`'s tests only; a marker expression given (`-m
    EXPR`) still applies, within the tier."""
    args = list(pytest_args)
    for index, arg in enumerate(args):
        if arg == "-m" and index + 1 < len(args):
            args[index + 1] = f"({args[index + 1]}) and {tier}"
            return args
        if arg.startswith("-m") and len(arg) > 2:
            args[index] = f"-m({arg[2:]}) and {tier}"
            return args
    return ["-m", tier, *args]


def command_services(args: argparse.Namespace) -> int:
    """Start only the private services and print their URLs, for a developer's shell;
    restart them if they die, until Ctrl-C or SIGTERM. Like `./run`, it holds the data
    folder: either would stop the servers the other uses."""
    serve = partial(serve_private_servers, args.data_dir)
    return holding_data_folder(args.data_dir, "python -m launcher services", serve)


def serve_private_servers(data_dir: Path) -> int:
    """`command_services` once it holds the data folder."""
    env: dict[str, str] = {}
    services = PrivateServers(data_dir)
    supervisor = Supervisor()
    supervisor.install_signal_handlers()
    try:
        services.provide(env)
        for name, value in env.items():
            print(f"export {name}='{value}'", flush=True)
        services.watch_with(supervisor)
        supervisor.wait()
        return 0
    finally:
        services.stop()


# What a role started alone needs from its environment: it joins a deployment whose
# servers already run (`./run` starts private ones instead).
ROLE_NEEDS = ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")


def command_role(args: argparse.Namespace) -> int:
    """One role of a deployment on this host (web, tree-worker, reports-worker, beat,
    fleet), its processes restarted when they die, until Ctrl-C or SIGTERM."""
    missing = [name for name in ROLE_NEEDS if not os.environ.get(name)]
    if missing:
        say(f"{args.command} needs {', '.join(missing)}: a role started alone joins a "
            "deployment whose PostgreSQL and Redis already run (./run starts its own)")  # fmt: skip
        return 2
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    metrics = args.data_dir / "metrics"  # shared by the host's roles: not emptied here
    metrics.mkdir(parents=True, exist_ok=True)
    env.setdefault("PROMETHEUS_MULTIPROC_DIR", str(metrics))
    supervisor = Supervisor()
    supervisor.install_signal_handlers()
    listener = None
    try:
        listener = args.start_role(supervisor, env, args)
        supervisor.wait()
        return 0
    finally:
        supervisor.stop_all()
        if listener is not None:
            listener.close()


def _web_role(supervisor: Supervisor, env: dict[str, str], args) -> socket.socket:
    return start_web(supervisor, env, host=args.host, port=args.port, processes=args.processes,
                     verbose=args.verbose)  # fmt: skip


def _tree_worker_role(supervisor: Supervisor, env: dict[str, str], args) -> None:
    subtree = ["--subtree", args.subtree] if args.subtree else []
    queues = manage(env, "worker_queues", *subtree, capture=True)
    say(f"tree worker for {args.subtree or 'the whole tree'}: {queues}")
    node = f"tree-{args.subtree or 'all'}@%h"  # two subtrees' workers may share a host
    start_tree_worker(supervisor, env, queues=queues, concurrency=args.concurrency,
                      verbose=args.verbose, name="tree-worker", node=node)  # fmt: skip


def _reports_worker_role(supervisor: Supervisor, env: dict[str, str], args) -> None:
    supervisor.start("reports", reports_worker_argv(verbose=args.verbose), env)


def _beat_role(supervisor: Supervisor, env: dict[str, str], args) -> None:
    start_beat(supervisor, env, data_dir=args.data_dir, verbose=args.verbose)


def _fleet_role(supervisor: Supervisor, env: dict[str, str], args) -> None:
    start_fleet(supervisor, env, host=args.host, port=args.port, agents=args.agents)


def add_role_parsers(commands) -> None:
    """The roles a deployment lays out over hosts (docs/deploy.md), each on its own."""
    web = _role_parser(commands, "web", "web processes on one port", _web_role)
    web.add_argument("--host", default="127.0.0.1", help="address to listen on")
    web.add_argument("--port", type=int, default=8000)
    web.add_argument("--processes", type=int, default=2, help="web processes (one socket)")
    tree = _role_parser(commands, "tree-worker", "a tree worker", _tree_worker_role)
    tree.add_argument("--subtree", metavar="DISPATCHER", help="only this subtree (e.g. d0.1) "
                      "and the dispatchers above it; default: the whole tree")  # fmt: skip
    tree.add_argument("--concurrency", type=int, default=2, help="worker processes")
    _role_parser(commands, "reports-worker", "the reports worker (Spark)", _reports_worker_role)
    _role_parser(commands, "beat", "the beat: exactly one per deployment", _beat_role)
    fleet = _role_parser(commands, "fleet", "simulated web servers' agents", _fleet_role)
    fleet.add_argument("--host", default="127.0.0.1", help="the web tier's address")
    fleet.add_argument("--port", type=int, default=8000)
    fleet.add_argument("--agents", type=int, default=40)


def _role_parser(commands, name: str, help_text: str, start_role) -> argparse.ArgumentParser:
    parser = commands.add_parser(name, help=f"{help_text} (needs {', '.join(ROLE_NEEDS)})")
    parser.add_argument("--verbose", action="store_true", help="log every request and task")
    add_data_dir_argument(parser)
    parser.set_defaults(handler=command_role, start_role=start_role)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m launcher")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the console with the demo")
    run.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
    run.add_argument(
        "--verbose", action="store_true", help="log every request and task (quiet otherwise)"
    )
    run.add_argument("--port", type=int, default=env_int("PORT", 8000, minimum=1))
    run.add_argument(
        "--fleet",
        type=int,
        default=env_int("DEMO_FLEET", 40, minimum=0),
        help="simulated web servers to run (0: none)",
    )
    add_data_dir_argument(run)
    # Read here, before anything starts, so that a malformed value stops the launcher
    # at once with a message naming it (main), not half-way through starting.
    run.set_defaults(
        handler=command_run,
        web_processes=env_int("WEB_PROCESSES", 2, minimum=1),
        worker_concurrency=env_int("WORKER_CONCURRENCY", 2, minimum=1),
    )
    test = commands.add_parser("test", help="run the tests: the fast tier, or --all")
    test.add_argument("--all", action="store_true", help="every tier (what CI runs)")
    test.set_defaults(handler=command_test)
    services = commands.add_parser("services", help="start only PostgreSQL and Redis")
    add_data_dir_argument(services)
    services.set_defaults(handler=command_services)
    add_role_parsers(commands)
    return parser


def add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        type=lambda value: Path(value).resolve(),
        default=default_data_dir(),
        help="where the private servers, the secret key and beat's schedule live",
    )


def main() -> int:
    # Everything after `test` belongs to pytest, options included.
    try:
        args, extra = build_parser().parse_known_args()
    except ConfigurationError as error:
        say(f"configuration error: {error}")
        return 2
    if extra and args.command != "test":
        build_parser().error(f"unrecognized arguments: {' '.join(extra)}")
    args.pytest_args = extra
    try:
        return args.handler(args)
    except ConfigurationError as error:  # found in the data folder, before any start
        say(f"configuration error: {error}")
        return 2
    except subprocess.CalledProcessError as error:
        say(f"a step failed ({' '.join(map(str, error.cmd[1:3]))}, exit {error.returncode})")
        return 1


if __name__ == "__main__":
    sys.exit(main())
