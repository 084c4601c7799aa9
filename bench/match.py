"""Benchmark of policies.Matcher against a brute-force loop.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.match                      # 100k receivers vs brute force, then 1M alone
    python -m bench.match --quick              # 20k receivers, 200 events, 100k second run
    python -m bench.match --make-workload FILE --subs 1000 --events 1000
    python -m bench.match --workload FILE      # content-only subscriptions (JSON Lines)
    python -m bench.match --workloads          # W1/W2 against BE-Tree and Siena

The symmetric workload: receivers with a 6-attribute model (software, version,
cgi, load, region, organization), 1,000 distinct policies of 2 OR-branches with
3 constraints each, 20 senders, events with 2-4 constraint selectors hitting
1-30% of receivers. The 1M figure runs in a fresh subprocess so that its
resident memory is not polluted by the first run.

``--workloads`` runs the four content-only workloads that other engines were measured
on, generated into var/bench/ if missing by bench.workloads (a synthetic workload in the
style of the Siena and BE-Tree papers; seed 1; integer values; operators == < > at
50/25/25 %; 1-3 constraints per subscription, each on a distinct attribute):

- W1 dense: N subscriptions for N = 1000, 10000 and 100000, 1000 events, 20 attributes,
  100 values, 5 attributes per event;
- W2 sparse: 10000 subscriptions, 1000 events, 100 attributes, 100 values, 5 attributes
  per event.

It prints one table: our median per event, the brute force's, BE-Tree's and Siena's
fixed figures on the same files (WORKLOADS below), our ratio to BE-Tree's and our match
totals against the expected ones.

The brute force everywhere is a plain loop over compiled constraints (each
filter of the DNF as ``(scope, name, test)`` triples), not ``Policy.accepts``
per receiver, so the printed ratio is honest; its results are asserted equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import workloads
from policies import Matcher, Policy, Selector, parse_policy, parse_selector
from policies.expressions import Constraint
from policies.types import compile_test

ROOT = Path(__file__).resolve().parent.parent

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
    """Per-event durations and results of a plain loop over every receiver's compiled
    policy and the event's compiled selector."""
    compiled: dict[Policy, CompiledRule] = {}
    rules = [
        ({"receiver": attributes}, compiled.setdefault(policy, compile_rule(policy)))
        for attributes, policy in receivers
    ]
    durations, results = [], []
    for sender, content, selector in events:
        started = time.perf_counter()
        wanted, scopes = compile_rule(selector), {"sender": sender, "event": content}
        found = {
            receiver_id
            for receiver_id, (receiver, policy) in enumerate(rules)
            if holds(wanted, receiver) and holds(policy, scopes)
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
        "-m",
        "bench.match",
        "--child",
        "--receivers",
        str(receivers),
        "--events",
        str(events),
        "--seed",
        str(seed),
    ]
    output = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# Brute force: a plain loop over compiled constraints, so that the ratio is honest

# (scope, name, test of a present value, negated, truth on a missing value)
CompiledConstraint = tuple[str, str, Callable[[Any], bool], bool, bool]
CompiledRule = tuple[tuple[CompiledConstraint, ...], ...]
_PRESENCE_TESTS = {"exists": lambda value: True, "not exists": lambda value: False}


def compile_rule(rule: Policy | Selector) -> CompiledRule:
    """The rule's filters (its DNF) as tuples of compiled constraints."""
    return tuple(tuple(_compile(c) for c in f.sorted_constraints()) for f in rule.filters())


def _compile(c: Constraint) -> CompiledConstraint:
    test = _PRESENCE_TESTS.get(c.op) or compile_test(c.op, c.value)
    return (c.scope, c.name, test, c.negated, c.holds_on(None))


def holds(rule: CompiledRule, scopes: dict[str, dict[str, Any]]) -> bool:
    """Does one filter of a compiled rule hold on these scopes?"""
    for conjunction in rule:
        for scope, name, test, negated, on_missing in conjunction:
            value = scopes[scope].get(name)
            if (not on_missing) if value is None else (test(value) == negated):
                break
        else:
            return True
    return False


def brute_force_subscribers(
    compiled: list[tuple[Any, CompiledRule]], sender: dict | None, content: dict | None
) -> set:
    """Ids of the subscriptions whose compiled policy accepts, by testing every one."""
    scopes = {"sender": sender or {}, "event": content or {}}
    return {sub_id for sub_id, rule in compiled if holds(rule, scopes)}


# ---------------------------------------------------------------------------
# Content-only workloads (JSON Lines), for comparison with other engines

WORKLOAD_ATTRIBUTES = [f"a{i}" for i in range(20)]


@dataclass(frozen=True)
class Workload:
    """A workload other engines were measured on: its parameters, their figures on it
    and the total of matches every engine finds."""

    label: str
    spec: workloads.Spec
    be_tree_us: float  # BE-Tree (C), JSON parsing included
    siena_us: float | None  # Siena 1.3 (Java), in-process; None: not measured
    matches: int  # over all its events
    goal: str  # what we aim for against BE-Tree

    @property
    def file_name(self) -> str:
        """Name of its JSON Lines file."""
        return self.label.lower().replace(" ", "-") + ".jsonl"


def _dense(subscriptions: int) -> workloads.Spec:
    """W1, dense: 1000 events, 20 attributes, 100 values, 5 attributes per event."""
    return workloads.Spec(subscriptions, 1000, attributes=20, values=100, attributes_per_event=5)


def _sparse(subscriptions: int) -> workloads.Spec:
    """W2, sparse: 1000 events, 100 attributes, 100 values, 5 attributes per event."""
    return workloads.Spec(subscriptions, 1000, attributes=100, values=100, attributes_per_event=5)


# The other engines' figures, in microseconds per event (the median over the workload's
# events), each engine finding the same match totals (`matches`): measured on a machine
# like ours with these exact workload files, as published with the workloads. BE-Tree
# (C) includes parsing the JSON; Siena 1.3 (Java) runs in-process and has no figure on
# W1 100k.
WORKLOADS = [
    Workload("W1 1k", _dense(1_000), 7.8, 93, 23_217, "within 1.5x"),
    Workload("W1 10k", _dense(10_000), 105, 3_675, 222_270, "within 1.5x"),
    Workload("W1 100k", _dense(100_000), 6_245, None, 2_239_322, "faster"),
    Workload("W2 10k", _sparse(10_000), 110, 795, 42_207, "within 1.5x"),
]


def ensure_workload(workload: Workload, directory: Path) -> Path:
    """The workload's JSON Lines file, generated by bench.workloads if missing."""
    target = directory / workload.file_name
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    workloads.write(workload.spec, partial)
    partial.replace(target)  # never a half-written file under the final name
    return target


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


def workload_run(path: Path, brute_events: int) -> dict:
    """Time content-only matching of a workload file against the brute force."""
    subscriptions, events = read_workload(path)
    matcher = Matcher()
    started = time.perf_counter()
    for sub_id, policy in subscriptions:
        matcher.add(sub_id, {}, policy)
    matcher.prepare()
    build = time.perf_counter() - started
    durations, found = [], []
    for content in events:
        begun = time.perf_counter()
        found.append(matcher.match({}, content))
        durations.append(time.perf_counter() - begun)
    compiled = [(sub_id, compile_rule(policy)) for sub_id, policy in subscriptions]
    brute = []
    for content, expected in zip(events[:brute_events], found, strict=False):
        begun = time.perf_counter()
        by_brute_force = brute_force_subscribers(compiled, {}, content)
        brute.append(time.perf_counter() - begun)
        assert by_brute_force == expected, "Matcher and brute force disagree"
    return {
        "subscriptions": len(subscriptions),
        "events": len(events),
        "build_seconds": build,
        "matcher_us": [1e6 * value for value in percentiles(durations)],
        "brute_us": 1e6 * statistics.median(brute),
        "brute_events": len(brute),
        "matches": sum(map(len, found)),
    }


def brute_events_for(subscriptions: int) -> int:
    """Events given to the brute force: about 3 million subscription tests."""
    return max(20, min(300, 3_000_000 // max(1, subscriptions)))


def run_workloads(chosen: list[tuple[Workload | None, Path]]) -> list[dict]:
    """Run each workload file and print the table against BE-Tree and Siena."""
    print(f"load average before: {_load()}")
    print(
        f"{'workload':<9} {'subs':>8} {'ours us':>9} {'p99 us':>9} {'brute us':>10} "
        f"{'BE-Tree us':>10} {'Siena us':>9} {'ours/BE':>8}  {'goal':<12} {'matches':>10} "
        f"{'expected':>10}"
    )
    rows = []
    for workload, path in chosen:
        lines = sum(1 for _ in path.open())
        report = workload_run(path, brute_events_for(lines))
        report["label"] = workload.label if workload else path.name
        rows.append(report)
        print(_table_row(report, workload), flush=True)
    print(f"load average after: {_load()}")
    print(
        "ours: median and p99 wall time per event;\n"
        "BE-Tree (C, JSON parsing included), Siena 1.3 (Java, in-process): their medians "
        "per event\non the same files, as published with the workloads;\n"
        "ours/BE: our median over BE-Tree's;\nbrute: median of a plain loop over compiled "
        "constraints (its results asserted equal to ours)."
    )
    return rows


def _table_row(report: dict, workload: Workload | None) -> str:
    median, p99 = report["matcher_us"]
    be_tree = f"{workload.be_tree_us:>10,.1f}" if workload else f"{'-':>10}"
    known_siena = workload is not None and workload.siena_us is not None
    siena = f"{workload.siena_us:>9,.1f}" if known_siena else f"{'-':>9}"
    ratio = f"{median / workload.be_tree_us:>7.2f}x" if workload else f"{'-':>8}"
    expected = f"{workload.matches:>10,}" if workload else f"{'-':>10}"
    if workload and report["matches"] != workload.matches:
        expected += " MISMATCH"
    return (
        f"{report['label']:<9} {report['subscriptions']:>8,} {median:>9,.1f} {p99:>9,.1f} "
        f"{report['brute_us']:>10,.1f} {be_tree} {siena} {ratio}  "
        f"{workload.goal if workload else '':<12} "
        f"{report['matches']:>10,} {expected}"
    )


def _load() -> str:
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def known_workload(path: Path) -> Workload | None:
    """The workload a file holds, recognised by its name."""
    return next((w for w in WORKLOADS if w.file_name == path.name), None)


# ---------------------------------------------------------------------------


def parse_arguments(argv: list[str] | None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.match", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--receivers", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=1000)
    parser.add_argument("--brute-events", type=int, default=30)
    parser.add_argument("--big", type=int, default=1_000_000, help="receivers of the 2nd run")
    parser.add_argument("--big-events", type=int, default=300)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workload", type=Path, help="one JSON Lines workload file")
    parser.add_argument(
        "--workloads",
        action="store_true",
        help="W1 1k/10k/100k and W2 10k against BE-Tree and Siena",
    )
    parser.add_argument("--workload-dir", type=Path, default=ROOT / "var" / "bench")
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
    if args.workloads:
        run_workloads([(w, ensure_workload(w, args.workload_dir)) for w in WORKLOADS])
        return
    if args.workload:
        run_workloads([(known_workload(args.workload), args.workload)])
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
