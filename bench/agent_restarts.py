"""The agent, killed at random: every command's action runs exactly once all the same.

Run as a module from the repository root, with the project's interpreter:

    python -m bench.agent_restarts                       # 2,000 commands to 5 agents
    python -m bench.agent_restarts --events 500 --agents 3 --kills 10

Real parts: Uvicorn, Celery workers running the dispatcher tree, private PostgreSQL and
Redis (var/bench), and `sn-agent run` from a wheel built from agent/ and installed in a
virtual environment of its own (var/bench/agent-venv), one process per agent, each
with its configuration, token file and state folder. The agents verify signatures, as
installed agents do: the console holds the trust manager's and the sender's keys (in
var/bench/agent-restarts/signing-keys) and signs each command. Each agent's one action
appends the notification it is given (one JSON line, from standard input, by `tee -a`)
to a file of its own: what the action really did, counted outside the agent.

While the commands are published, every agent process is killed with SIGKILL at random
moments and started again at once, at least `--kills` times. Printed: for each agent,
the event ids its file holds once, twice or never (lost and run twice must be 0), the
deliveries the console recorded as answered, and how; then the footprint of an idle
agent (memory, CPU over a quiet minute) beside a bare Python interpreter's, and the time
from a notification's arrival to its action's start beside starting the same command
directly (the baseline, measured in the same run).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import venv
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.chaos import PORT, Stack, _environment
from bench.services import cpu_seconds, fresh_database, provide_services, wait_for_tree_idle
from demo.data_folder import write_new_private

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "var" / "bench" / "agent-restarts"
SELECTOR = 'receiver.organization == "Macrocorp"'
SETTLE_TIMEOUT_S = 300.0
IDLE_WINDOW_S = 60.0


@dataclass
class AgentProcess:
    """One agent: its folder, its current process, and how often it was killed."""

    name: str
    folder: Path
    bin: Path
    process: subprocess.Popen | None = None
    kills: int = 0
    log: object = None

    @property
    def ran(self) -> Path:
        return self.folder / "ran.jsonl"

    def start(self) -> None:
        argv = [str(self.bin / "sn-agent"), "run", "--config", str(self.folder / "agent.toml")]
        self.process = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def kill_and_start(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()
        self.kills += 1
        self.start()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=60)


@dataclass
class Killer:
    """Kills each agent at random moments until told to stop and each had `least`."""

    agents: list[AgentProcess]
    least: int
    mean_gap_s: float
    done: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def finish(self) -> None:
        """Go on until every agent was killed `least` times, then stop."""
        self.done.set()
        self.thread.join()

    def _run(self) -> None:
        rng = random.Random(7)
        while not (self.done.is_set() and min(a.kills for a in self.agents) >= self.least):
            time.sleep(rng.expovariate(1 / self.mean_gap_s) / len(self.agents))
            rng.choice(self.agents).kill_and_start()


def installed_agent() -> Path:
    """A virtual environment holding the wheel built from agent/ (nothing else of ours)."""
    wheels = FOLDER / "wheel"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, ROOT / "agent"],
        check=True,
    )
    wheel = max(wheels.glob("sn_agent-*.whl"), key=lambda p: p.stat().st_mtime)
    env = FOLDER / "agent-venv"
    if not (env / "bin" / "python").exists():
        venv.create(env, with_pip=True)
    pip = [env / "bin" / "python", "-m", "pip", "install", "-q", "--force-reinstall", wheel]
    subprocess.run(pip, check=True)
    return env / "bin"


def prepare_agents(count: int, bin_folder: Path, url: str) -> list[AgentProcess]:
    from broker.audit import Actor
    from broker.models import Client
    from broker.services.clients import issue_token

    agents = []
    for client in Client.objects.filter(name__startswith="web-").order_by("name")[:count]:
        folder = FOLDER / "agents" / client.name
        folder.mkdir(parents=True, exist_ok=True)
        token = issue_token(client=client, actor=Actor("system", "bench"))
        write_new_private(folder / "token", token)  # the folder was emptied: a new file
        (folder / "agent.toml").write_text(config_text(client, url, folder))
        log = open(folder / "agent.log", "a")  # noqa: SIM115 - open while the bench runs
        agents.append(AgentProcess(client.name, folder, bin_folder, log=log))
    return agents


def config_text(client, url: str, folder: Path) -> str:
    from demo.scenario import WEB_SERVER_POLICY, trusted_authorities

    stated = {v.name: v.value for v in client.attribute_values.all() if v.source == "client"}
    attributes = "\n".join(f"{name} = {json.dumps(value)}" for name, value in stated.items())
    (folder / "policy").write_text(WEB_SERVER_POLICY)
    trusted = ", ".join(f"{n} = {json.dumps(keys)}" for n, keys in trusted_authorities().items())
    return f"""\
url = "{url}"
token_file = "token"
state_dir = "state"
policy_file = "policy"
# The action appends to a file in the bench's folder, which is its runner's own.
action_user = "{getpass.getuser()}"

[trust]
authorities = {{ {trusted} }}

[attributes]
{attributes}

[actions.append]
command = ["tee", "-a", "{folder / "ran.jsonl"}"]
timeout_s = 30
"""


def publish(events: int, rate_per_s: float) -> list[str]:
    """Publish `events` commands to every web server, at about `rate_per_s`."""
    from broker.models import Client
    from broker.services.events import publish_event

    sender = Client.objects.get(name="intellimune-national")
    published, started = [], time.monotonic()
    for number in range(events):
        event = publish_event(
            sender=sender,
            content={"kind": "command", "action": "append", "n": number},
            selector=SELECTOR,
            lifetime_s=3600,
            channel="commands",
            console_signs=True,
        )
        published.append(str(event.pk))
        time.sleep(max(0.0, started + (number + 1) / rate_per_s - time.monotonic()))
    return published


def wait_until_answered(expected: int) -> float:
    from django.db import close_old_connections

    from broker.models import Delivery

    started = time.monotonic()
    while time.monotonic() - started < SETTLE_TIMEOUT_S:
        close_old_connections()
        if Delivery.objects.filter(state__in=("acked", "failed")).count() >= expected:
            break
        time.sleep(1)
    return time.monotonic() - started


def counted(agents: list[AgentProcess], published: list[str]) -> dict:
    """What each agent's action really did, against what was published."""
    lost = twice = 0
    for agent in agents:
        lines = agent.ran.read_text().splitlines() if agent.ran.exists() else []
        runs = Counter(json.loads(line)["event"] for line in lines)
        lost += sum(1 for event in published if runs[event] == 0)
        twice += sum(1 for count in runs.values() if count > 1)
    return {"lost": lost, "run twice": twice}


def answers(published: list[str]) -> Counter:
    from broker.models import Delivery

    return Counter(Delivery.objects.filter(event_id__in=published).values_list("state", flat=True))


def event_pages_showing_every_answer(published: list[str], receivers: int) -> tuple[int, int]:
    """Of a sample of the console's event pages, how many count every receiver's
    answer (answered ok plus failed), and the sample's size."""
    from django.contrib.auth import get_user_model

    from bench.services import logged_in_web_client

    user, _ = get_user_model().objects.get_or_create(username="bench-auditor", is_superuser=True)
    web = logged_in_web_client(user)
    sample = published[:: max(1, len(published) // 20)]
    shown = 0
    for event in sample:
        page = web.get(f"/events/{event}/", HTTP_HOST="localhost").content.decode()
        counts = {k: int(v) for k, v in re.findall(r'data-(acked|failed)="(\d+)"', page)}
        shown += sum(counts.values()) == receivers
    return shown, len(sample)


def start_latencies_ms(agents: list[AgentProcess]) -> list[float]:
    """From each `notification` line to its `action_started` line, in the agents' logs."""
    values = []
    for agent in agents:
        arrived = {}
        for line in (agent.folder / "agent.log").read_text().splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            at = _seconds(entry["at"])
            if entry["event"] == "notification":
                arrived[entry["position"]] = at
            elif entry["event"] == "action_started" and entry["position"] in arrived:
                values.append((at - arrived.pop(entry["position"])) * 1000)
    return values


def _seconds(stamp: str) -> float:
    whole, millis = stamp.rstrip("Z").split(".")
    return time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000


def direct_start_ms(samples: int = 200) -> list[float]:
    """The baseline: starting the same command directly, to its exec."""
    values = []
    target = FOLDER / "baseline.jsonl"
    for _ in range(samples):
        started = time.monotonic()
        process = subprocess.Popen(["tee", "-a", str(target)], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL)  # fmt: skip
        values.append((time.monotonic() - started) * 1000)
        process.wait()
    return values


def footprint(agents: list[AgentProcess]) -> dict:
    """Idle agents' resident memory and CPU over IDLE_WINDOW_S, beside a bare Python."""
    bare = subprocess.Popen([str(agents[0].bin / "python"), "-c", "import time; time.sleep(600)"])
    time.sleep(2)
    pids = [a.process.pid for a in agents]
    before = cpu_seconds(pids)
    time.sleep(IDLE_WINDOW_S)
    cpu = (cpu_seconds(pids) - before) / len(agents) / IDLE_WINDOW_S * 100
    rss = statistics.median(_rss_mib(pid) for pid in pids)
    figures = {"agent MiB": rss, "bare python MiB": _rss_mib(bare.pid), "agent CPU %": cpu}
    bare.kill()
    return figures


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(args, env: dict[str, str], servers: dict) -> int:
    from django.core.management import call_command

    from demo.scenario import ensure_signing_keys, load_scenario

    call_command("collectstatic", interactive=False, verbosity=0)  # the event pages link them
    fresh_database(env)
    load_scenario(servers=args.agents)
    ensure_signing_keys()  # the console signs; the agents verify
    shutil.rmtree(FOLDER / "agents", ignore_errors=True)  # journals of an earlier database
    bin_folder = installed_agent()
    log = open(FOLDER / "console.log", "w")  # noqa: SIM115
    stack = Stack(env=env, servers=servers, log=log)
    stack.start_console(web=1, workers=2)
    agents = prepare_agents(args.agents, bin_folder, f"ws://127.0.0.1:{PORT}/ws/agent/v1/")
    try:
        wait_for_tree_idle(timeout_s=120)
        for agent in agents:
            agent.start()
        time.sleep(3)
        return measure(args, agents)
    finally:
        for agent in agents:
            agent.stop()
        stack.stop()
        log.close()


def measure(args, agents: list[AgentProcess]) -> int:
    killer = Killer(agents, least=args.kills, mean_gap_s=args.events / args.rate / args.kills)
    killer.start()
    started = time.monotonic()
    published = publish(args.events, args.rate)
    killer.finish()
    settle_s = wait_until_answered(len(published) * len(agents))
    print(f"published {len(published):,} commands in {time.monotonic() - started:.0f} s; "
          f"answered {settle_s:.0f} s after the last kill")  # fmt: skip
    print(f"kills per agent: {sorted(a.kills for a in agents)}")
    figures = counted(agents, published)
    print(f"actions' own files: lost {figures['lost']}, run twice {figures['run twice']}")
    print(f"console's answers: {dict(answers(published))}")
    shown, sample = event_pages_showing_every_answer(published, len(agents))
    print(f"console event pages counting every agent's answer: {shown} of {sample}")
    report_speed_and_footprint(agents)
    return 1 if figures["lost"] or figures["run twice"] else 0


def report_speed_and_footprint(agents: list[AgentProcess]) -> None:
    through_agent, direct = start_latencies_ms(agents), direct_start_ms()
    print(f"notification to action start: median {percentile(through_agent, 0.5):.1f} ms, "
          f"p95 {percentile(through_agent, 0.95):.1f} ms (n={len(through_agent):,}); "
          f"baseline, the command started directly: median {percentile(direct, 0.5):.1f} ms")  # fmt: skip  # noqa: E501
    idle = footprint(agents)
    print(f"idle agent: {idle['agent MiB']:.1f} MiB resident (bare python: "
          f"{idle['bare python MiB']:.1f} MiB), CPU {idle['agent CPU %']:.3f} % over "
          f"{IDLE_WINDOW_S:.0f} s")  # fmt: skip


def signing_keys_folder() -> Path:
    """The bench's own signing keys, beside its own database, made afresh each run (the
    database is): never the demo's."""
    keys = FOLDER / "signing-keys"
    shutil.rmtree(keys, ignore_errors=True)
    keys.mkdir(mode=0o700)
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_restarts")
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--agents", type=int, default=5)
    parser.add_argument("--kills", type=int, default=20, help="at least, per agent")
    parser.add_argument("--rate", type=float, default=20.0, help="commands per second")
    args = parser.parse_args()
    if os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"):
        print("the bench runs on private PostgreSQL and Redis: unset the URLs")
        return 2
    FOLDER.mkdir(parents=True, exist_ok=True)
    env = {**_environment(), "SIGNING_KEYS_DIR": str(signing_keys_folder())}
    started = provide_services(env)
    os.environ.update(env)
    import django

    django.setup()
    print(f"agent restarts: {args.events:,} commands to {args.agents} agents, "
          f"each killed at least {args.kills} times")  # fmt: skip
    try:
        return run(args, env, {"postgres": started[0], "redis": started[1]})
    finally:
        for server in reversed(started):
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
