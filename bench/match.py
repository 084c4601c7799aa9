"""Benchmark of policies.Matcher against a brute-force loop.

    python bench/match.py                      # 100k receivers vs brute force, then 1M alone
    python bench/match.py --quick              # 20k receivers, 200 events, 100k second run
    python bench/match.py --make-workload FILE --subs 1000 --events 1000
    python bench/match.py --workload FILE      # content-only subscriptions (JSON Lines)

The symmetric workload: receivers with a 6-attribute model (software, version,
cgi, load, region, organization), 1,000 distinct policies of 2 OR-branches with
3 constraints each, 20 senders, events with 2-4 constraint selectors hitting
1-30% of receivers. The 1M figure runs in a fresh subprocess so that its
resident memory is not polluted by the first run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a script from anywhere: make the repository importable.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil

from policies import Matcher, Policy, Selector, parse_policy, parse_selector

SOFTWARE = [("IIS", 0.5), ("Apache", 0.3), ("nginx", 0.2)]
VERSIONS = ["2.2", "2.4", "2.4.1", "2.4.7", "2.10", "3.0", "3.1"]
REGIONS = ["Northwest", "Northeast", "Southwest", "Southeast", "Central", "Pacific"]
REGIONS += ["Mountain", "Atlantic"]
ORGANIZATIONS = [f"Org{i}" for i in range(10)]
SENDER_ORGS = ["Intellimune", "Gov", "Macrocorp", "Vendor1", "Vendor2"]
KINDS = ["command", "alert", "status"]

RECEIVER_MODEL = {
    "software": "string",
    "version": "version",
    "cgi": "bool",
    "load": "float",
    "region": "string",
    "organization": "string",
}
SENDER_MODEL = {"organization": "string", "scope": "string", "region": "string", "trust": "int"}
EVENT_MODEL = {"kind": "string", "alert": "string", "threat_level": "int"}


# ---------------------------------------------------------------------------
# Symmetric workload


def receiver_attributes(rng: random.Random) -> dict[str, Any]:
    """One web server's advertised attributes."""
    names, weights = zip(*SOFTWARE, strict=True)
    return {
        "software": rng.choices(names, weights)[0],
        "version": rng.choice(VERSIONS),
        "cgi": rng.random() < 0.5,
        "load": round(rng.random(), 4),
        "region": rng.choice(REGIONS),
        "organization": rng.choice(ORGANIZATIONS),
    }


def _policy_constraint(rng: random.Random) -> str:
    makers: list[Callable[[], str]] = [
        lambda: f'sender.organization == "{rng.choice(SENDER_ORGS)}"',
        lambda: f'sender.scope == "{rng.choice(["regional", "national"])}"',
        lambda: f'sender.region == "{rng.choice(REGIONS)}"',
        lambda: f"sender.trust >= {rng.randint(0, 4)}",
        lambda: f'event.kind == "{rng.choice(KINDS)}"',
        lambda: f"event.threat_level >= {rng.randint(0, 5)}",
        lambda: "event.alert exists",
    ]
    return rng.choice(makers)()


def make_policies(rng: random.Random, count: int) -> list[Policy]:
    """``count`` distinct policies of 2 OR-branches with 3 constraints each."""
    texts: set[str] = set()
    while len(texts) < count:
        branches = []
        for _ in range(2):
            constraints = set()
            while len(constraints) < 3:
                constraints.add(_policy_constraint(rng))
            branches.append("(" + " and ".join(sorted(constraints)) + ")")
        texts.add("accept " + " or ".join(branches))
    return [
        parse_policy(text, sender_model=SENDER_MODEL, event_model=EVENT_MODEL)
        for text in sorted(texts)
    ]


def make_senders(rng: random.Random, count: int = 20) -> list[dict[str, Any]]:
    """Controllers with attested attributes."""
    return [
        {
            "organization": rng.choice(SENDER_ORGS),
            "scope": rng.choice(["regional", "national"]),
            "region": rng.choice(REGIONS),
            "trust": rng.randint(0, 4),
        }
        for _ in range(count)
    ]


# (selector constraint, approximate share of receivers it selects)
def _selector_constraint(rng: random.Random) -> tuple[str, float]:
    threshold = round(rng.uniform(0.3, 0.95), 2)
    options = [(f'software == "{name}"', weight) for name, weight in SOFTWARE] + [
        ('version ~ "2.4*"', 3 / 7),
        ('version >= "2.4"', 6 / 7),
        ("cgi == true", 0.5),
        (f"load >= {threshold}", 1 - threshold),
        (f'region == "{rng.choice(REGIONS)}"', 1 / 8),
        (f'region in ["{rng.choice(REGIONS)}", "{rng.choice(REGIONS)}"]', 2 / 8),
        (f'organization == "{rng.choice(ORGANIZATIONS)}"', 0.1),
        (f'not organization == "{rng.choice(ORGANIZATIONS)}"', 0.9),
    ]
    return rng.choice(options)


def make_selector(rng: random.Random, sample: list[dict[str, Any]]) -> Selector:
    """A 2-4 constraint selector hitting 1-30% of a sample of receivers."""
    while True:
        chosen = dict(_selector_constraint(rng) for _ in range(rng.randint(2, 4)))
        if len(chosen) < 2:
            continue
        selector = parse_selector(" and ".join(chosen), receiver_model=RECEIVER_MODEL)
        share = sum(selector.selects(receiver) for receiver in sample) / len(sample)
        if 0.01 <= share <= 0.30:
            return selector


def make_events(rng: random.Random, count: int, senders: list[dict]) -> list[tuple]:
    """(sender, content, selector) triples."""
    sample = [receiver_attributes(rng) for _ in range(2000)]
    events = []
    for _ in range(count):
        content: dict[str, Any] = {"kind": rng.choice(KINDS), "threat_level": rng.randint(0, 5)}
        if rng.random() < 0.5:
            content["alert"] = "worm"
        events.append((rng.choice(senders), content, make_selector(rng, sample)))
    return events


def rss_mb() -> float:
    """Resident memory of this process in MB."""
    return psutil.Process().memory_info().rss / 2**20


def percentiles(samples: list[float]) -> tuple[float, float]:
    """(median, p99) of a list of durations."""
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return statistics.median(ordered), p99


def build_matcher(rng: random.Random, receivers: int, policies: list[Policy], keep: bool):
    """Fill a Matcher; also return the receivers when brute force needs them."""
    matcher = Matcher()
    kept: list[tuple[dict, Policy]] = []
    started = time.perf_counter()
    for receiver_id in range(receivers):
        attributes = receiver_attributes(rng)
        policy = rng.choice(policies)
        matcher.add(receiver_id, attributes, policy)
        if keep:
            kept.append((attributes, policy))
    return matcher, kept, time.perf_counter() - started


def time_matcher(matcher: Matcher, events: list[tuple]) -> tuple[list[float], list[set]]:
    """Per-event durations and results of Matcher.match."""
    durations, results = [], []
    for sender, content, selector in events:
        started = time.perf_counter()
        found = matcher.match(sender, content, selector)
        durations.append(time.perf_counter() - started)
        results.append(found)
    return durations, results


def time_brute_force(receivers: list[tuple[dict, Policy]], events: list[tuple]):
    """Per-event durations and results of the obvious loop over every receiver."""
    durations, results = [], []
    for sender, content, selector in events:
        started = time.perf_counter()
        found = {
            receiver_id
            for receiver_id, (attributes, policy) in enumerate(receivers)
            if selector.selects(attributes) and policy.accepts(sender, content)
        }
        durations.append(time.perf_counter() - started)
        results.append(found)
    return durations, results


def symmetric_run(receivers: int, event_count: int, brute_events: int, seed: int) -> dict:
    """Build, warm up and time the Matcher (and brute force on a prefix of the events)."""
    rng = random.Random(seed)
    policies = make_policies(rng, 1000)
    senders = make_senders(rng)
    events = make_events(rng, event_count, senders)
    base_rss = rss_mb()
    matcher, kept, add_seconds = build_matcher(rng, receivers, policies, keep=brute_events > 0)
    started = time.perf_counter()
    matcher.prepare()  # builds the lazy indexes
    for event in events[:10]:  # and the few structures first used by some selector
        matcher.match(*event)
    warm_seconds = time.perf_counter() - started
    durations, results = time_matcher(matcher, events)
    selected = [len(matcher.selected(selector)) / receivers for _, _, selector in events[:50]]
    report = {
        "receivers": receivers,
        "events": event_count,
        "add_seconds": add_seconds,
        "warm_seconds": warm_seconds,
        "matcher_ms": [1000 * value for value in percentiles(durations)],
        "delivered_mean": statistics.mean(len(found) for found in results),
        "selected_share": (min(selected), statistics.median(selected), max(selected)),
        "rss_mb": rss_mb(),
        "rss_growth_mb": rss_mb() - base_rss,
    }
    if brute_events:
        brute, expected = time_brute_force(kept, events[:brute_events])
        assert expected == results[:brute_events], "Matcher and brute force disagree"
        report["brute_events"] = brute_events
        report["brute_ms"] = [1000 * value for value in percentiles(brute)]
    return report


def print_symmetric(report: dict, title: str) -> None:
    """Human-readable figures of one symmetric run."""
    median, p99 = report["matcher_ms"]
    low, mid, high = report["selected_share"]
    print(f"== {title}: {report['receivers']:,} receivers, {report['events']} events")
    print(
        f"   build: add {report['add_seconds']:.2f} s + index build and 10 warm-up events "
        f"{report['warm_seconds']:.2f} s"
    )
    print(
        f"   selectors hit {low:.1%} / {mid:.1%} / {high:.1%} (min/median/max) of receivers; "
        f"{report['delivered_mean']:.0f} deliveries per event on average"
    )
    print(f"   Matcher:     median {median:8.3f} ms   p99 {p99:8.3f} ms per event")
    if "brute_ms" in report:
        brute_median, brute_p99 = report["brute_ms"]
        print(
            f"   brute force: median {brute_median:8.3f} ms   p99 {brute_p99:8.3f} ms per event "
            f"(first {report['brute_events']} events, results identical)"
        )
        print(
            f"   ratio:       {brute_median / median:.0f}x at the median, "
            f"{brute_p99 / p99:.0f}x at p99"
        )
    print(
        f"   resident memory: {report['rss_mb']:.0f} MB "
        f"(receivers + indexes: {report['rss_growth_mb']:.0f} MB)"
    )


def run_child(receivers: int, events: int, seed: int) -> dict:
    """Run a Matcher-only measurement in a fresh interpreter; return its report."""
    command = [
        sys.executable,
        __file__,
        "--child",
        "--receivers",
        str(receivers),
        "--events",
        str(events),
        "--seed",
        str(seed),
    ]
    output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Content-only workload (JSON Lines), for comparison with other engines

WORKLOAD_ATTRIBUTES = [f"a{i}" for i in range(20)]


def make_workload(path: Path, subs: int, events: int, seed: int) -> None:
    """Subscriptions with 1-3 constraints, events with 5 of 20 attributes, values 0-99."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for index in range(subs):
            names = rng.sample(WORKLOAD_ATTRIBUTES, rng.randint(1, 3))
            parts = [
                f"event.{n} {rng.choice(['<', '>', '==', '<=', '>='])} {rng.randint(0, 99)}"
                for n in names
            ]
            out.write(json.dumps({"id": f"s{index}", "policy": "accept " + " and ".join(parts)}))
            out.write("\n")
        for _ in range(events):
            names = rng.sample(WORKLOAD_ATTRIBUTES, 5)
            out.write(json.dumps({"event": {n: rng.randint(0, 99) for n in names}}) + "\n")


def read_workload(path: Path) -> tuple[list[tuple[str, Policy]], list[dict]]:
    """Subscriptions (id, policy) and event contents of a JSON Lines workload."""
    subscriptions, events = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        record = json.loads(line)
        if "policy" in record:
            subscriptions.append((record["id"], parse_policy(record["policy"])))
        else:
            events.append(record["event"])
    return subscriptions, events


def workload_run(path: Path, brute_events: int) -> None:
    """Time content-only matching of a workload file and print the figures."""
    subscriptions, events = read_workload(path)
    matcher = Matcher()
    started = time.perf_counter()
    for sub_id, policy in subscriptions:
        matcher.add(sub_id, {}, policy)
    matcher.match({}, events[0])
    build = time.perf_counter() - started
    durations, matches = [], 0
    for content in events:
        begun = time.perf_counter()
        matches += len(matcher.match({}, content))
        durations.append(time.perf_counter() - begun)
    brute = []
    for content in events[:brute_events]:
        begun = time.perf_counter()
        expected = {s for s, policy in subscriptions if policy.accepts({}, content)}
        brute.append(time.perf_counter() - begun)
        assert expected == matcher.match({}, content), "Matcher and brute force disagree"
    median, p99 = (1e6 * value for value in percentiles(durations))
    brute_median, _ = (1e6 * value for value in percentiles(brute))
    print(
        f"== workload {path.name}: {len(subscriptions):,} subscriptions, {len(events)} events "
        f"(build {build:.2f} s)"
    )
    print(
        f"   Matcher: median {median:.1f} us   p99 {p99:.1f} us per event; "
        f"{matches} matches in total"
    )
    print(
        f"   brute force: median {brute_median:.1f} us per event "
        f"(first {len(brute)} events, identical results); ratio {brute_median / median:.0f}x"
    )


# ---------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--receivers", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--brute-events", type=int, default=30)
    parser.add_argument("--big", type=int, default=1_000_000, help="receivers of the 2nd run")
    parser.add_argument("--big-events", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workload", type=Path)
    parser.add_argument("--make-workload", type=Path)
    parser.add_argument("--subs", type=int, default=1000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point."""
    args = parse_arguments(argv)
    if args.make_workload:
        make_workload(args.make_workload, args.subs, args.events, args.seed)
        return
    if args.workload:
        workload_run(args.workload, brute_events=min(args.brute_events * 10, 300))
        return
    if args.child:
        print(json.dumps(symmetric_run(args.receivers, args.events, 0, args.seed)))
        return
    if args.quick:
        args.receivers, args.events, args.big, args.big_events = 20_000, 200, 100_000, 100
    print_symmetric(
        symmetric_run(args.receivers, args.events, args.brute_events, args.seed),
        "Matcher vs brute force",
    )
    if args.big:
        print_symmetric(
            run_child(args.big, args.big_events, args.seed), "Matcher alone, fresh process"
        )


if __name__ == "__main__":
    main()
