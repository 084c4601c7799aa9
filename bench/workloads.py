"""Synthetic content-based matching workloads, in the style of the Siena and BE-Tree papers.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.workloads 1000 1000 20 100 5 w1-1k.jsonl     # W1 dense, 1k subscriptions
    python -m bench.workloads 10000 1000 100 100 5 w2-10k.jsonl  # W2 sparse

A workload is a file of JSON Lines that `python -m bench.match --workload FILE` reads:
first the subscriptions, one a line (`{"id": "s0", "policy": "accept event.a3 < 41 and
event.a17 == 5"}`, ids s0, s1, ... in order), then the events (`{"event": {"a12": 7,
...}}`). Attributes are named a0 .. a{ATTRS-1} and every value is an integer in
[0, VALUES).

- A subscription has 1 to 3 constraints (by default), each on a distinct attribute
  drawn uniformly; a constraint's operator is ==, < or > with weights 50/25/25 and its
  value is drawn uniformly.
- An event has ATTRS_PER_EVENT distinct attributes drawn uniformly, each with a value
  drawn uniformly.

Everything is drawn from one `random.Random(seed)` (seed 1 by default) in a fixed order,
subscriptions first, so that the same parameters always give the same file, byte for
byte. That order is the generator's contract: the match totals and the other engines'
figures quoted by bench.match were measured on files generated exactly so.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# A constraint's operator and its weight.
OPERATORS = ("==", "<", ">")
OPERATOR_WEIGHTS = (50, 25, 25)


@dataclass(frozen=True)
class Spec:
    """The parameters of a workload."""

    subscriptions: int
    events: int
    attributes: int  # how many attributes exist (a0 .. a{attributes-1})
    values: int  # every value is an integer in [0, values)
    attributes_per_event: int
    constraints: tuple[int, int] = (1, 3)  # fewest and most constraints per subscription
    seed: int = 1


def records(spec: Spec) -> Iterator[dict]:
    """The workload's subscriptions then events, as the JSON objects of its lines.

    The draws, in order, for each subscription: how many constraints (randint), their
    attributes (sample), then for each constraint its operator (choices) and its value
    (randrange); for each event: its attributes (sample), then each one's value
    (randrange). Changing this order changes every workload.
    """
    rng = random.Random(spec.seed)
    names = range(spec.attributes)
    fewest, most = spec.constraints
    for index in range(spec.subscriptions):
        constraints = []
        for attribute in rng.sample(names, rng.randint(fewest, most)):
            operator = rng.choices(OPERATORS, OPERATOR_WEIGHTS)[0]
            constraints.append(f"event.a{attribute} {operator} {rng.randrange(spec.values)}")
        yield {"id": f"s{index}", "policy": "accept " + " and ".join(constraints)}
    for _ in range(spec.events):
        attributes = rng.sample(names, spec.attributes_per_event)
        yield {"event": {f"a{attribute}": rng.randrange(spec.values) for attribute in attributes}}


def write(spec: Spec, path: Path) -> None:
    """Write the workload to `path` as JSON Lines."""
    with path.open("w") as out:
        for record in records(spec):
            out.write(json.dumps(record) + "\n")


def main(argv: list[str] | None = None) -> None:
    """Command line: the workload's parameters and the file to write."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.workloads", description=__doc__.splitlines()[0]
    )
    for name in ("subs", "events", "attrs", "values", "attrs_per_event"):
        parser.add_argument(name, type=int, metavar=name.upper())
    parser.add_argument("out", type=Path, metavar="OUT.jsonl")
    parser.add_argument("--constraints", type=int, nargs=2, default=[1, 3], metavar=("MIN", "MAX"))
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    spec = Spec(
        subscriptions=args.subs,
        events=args.events,
        attributes=args.attrs,
        values=args.values,
        attributes_per_event=args.attrs_per_event,
        constraints=(args.constraints[0], args.constraints[1]),
        seed=args.seed,
    )
    write(spec, args.out)


if __name__ == "__main__":
    main()
