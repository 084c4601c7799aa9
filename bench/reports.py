"""The five reports on Spark over 1,000,000 and 10,000,000 delivery records, and the
same reports in one process with DuckDB over the 1,000,000: where Spark starts to pay.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.reports                          # 1M and 10M, 3 runs of each job
    python -m bench.reports --sizes 1000000 --runs 1
    python -m bench.reports --reuse                  # keep (and reuse) generated data

For each size, a database of its own in a private PostgreSQL under var/bench-reports
(unless DATABASE_URL / REDIS_URL are set) is filled by `manage.py generate_traffic`
(100,000 servers, the incident sized to the delivery records asked), then exported to
a Parquet dataset of its own by `manage.py export_dataset`: both are timed.

Then each report runs in a process of its own, so that its memory is its own: the
process starts Spark (local[*], SPARK_DRIVER_MEMORY, default 4g here) and says how long
that took, then runs the job --runs times over the whole incident's window. Printed per
report: Spark's start-up, the job's median and first run, the peak resident memory of
the process and of Spark's JVM (each process's high-water mark), and the rows the job
returned. The baseline runs the same reports in one process with DuckDB over the same
Parquet files (bench/reports_baseline.py), on the 1,000,000 only, and prints the same
figures; Spark's median over DuckDB's is the ratio. Last, how each report grew from the
smallest size to the largest (10x the records: 10.0 is linear).

Exits 1 if a report over the largest size took longer than --budget-s (the issue: 180 s),
counting the job's median run and Spark's start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.services import fresh_database, run_in_process

ROOT = Path(__file__).resolve().parent.parent

FOLDER = ROOT / "var" / "bench-reports"
KINDS = ("timeline", "reach", "audit", "tree", "latency")


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reports", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--servers", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--reports", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--baseline-size", type=int, default=1_000_000)
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "REPORT"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main() -> None:
    args = arguments()
    if args.child:
        child(args)
        return
    run_in_process(run, args, FOLDER)


def run(args: argparse.Namespace, env: dict[str, str]) -> bool:
    env.setdefault("SPARK_DRIVER_MEMORY", "4g")
    results = {}
    for size in args.sizes:
        sized = environment_for(env, size)
        prepare(args, sized, size)
        results[size] = measure(args, sized, size)
    print_growth(results, args)
    return within_budget(results, args)


def environment_for(env: dict[str, str], size: int) -> dict[str, str]:
    """The environment of one size: its own database and its own dataset."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(env["DATABASE_URL"])
    url = urlunsplit(parts._replace(path=f"/bench_reports_{size}"))
    return {**env, "DATABASE_URL": url, "REPORTS_DATASET": str(FOLDER / f"dataset-{size}")}


def prepare(args: argparse.Namespace, env: dict[str, str], size: int) -> None:
    """Generate the traffic and export it, unless --reuse finds both done."""
    done_mark = Path(env["REPORTS_DATASET"]) / ".generated"
    if args.reuse and done_mark.exists():
        print(f"\n== {size:,} delivery records (reused: {done_mark.read_text().strip()})")
        return
    print(f"\n== {size:,} delivery records")
    fresh_database(env)
    started = time.monotonic()
    manage(env, "generate_traffic", "--servers", str(args.servers), "--deliveries", str(size))
    generated = time.monotonic() - started
    started = time.monotonic()
    manage(env, "export_dataset")
    exported = time.monotonic() - started
    on_disk = sum(f.stat().st_size for f in Path(env["REPORTS_DATASET"]).rglob("*.parquet"))
    summary = f"generated in {generated:.0f} s, exported in {exported:.0f} s, "
    summary += f"{on_disk / 1e6:,.0f} MB of Parquet"
    print(summary)
    done_mark.write_text(summary + "\n")


def manage(env: dict[str, str], *argv: str) -> None:
    command = [sys.executable, str(ROOT / "manage.py"), *argv]
    subprocess.run(command, env=env, check=True)


def measure(args: argparse.Namespace, env: dict[str, str], size: int) -> dict:
    """Every report on Spark, and on DuckDB at the baseline's size; printed as it goes."""
    print(f"{'report':<10} {'engine':<7} {'start-up s':>10} {'median s':>9} {'first s':>8} "
          f"{'peak MB':>8} {'JVM MB':>7} {'rows':>7} {'vs DuckDB':>9}")  # fmt: skip
    figures = {}
    for kind in args.reports:
        spark = in_child(env, "spark", kind, args.runs)
        duck = in_child(env, "duckdb", kind, args.runs) if size == args.baseline_size else None
        print_row(kind, "spark", spark, duck)
        if duck:
            print_row(kind, "duckdb", duck, None)
        figures[kind] = spark
    return figures


def in_child(env: dict[str, str], engine: str, kind: str, runs: int) -> dict:
    command = [sys.executable, "-m", "bench.reports", "--child", engine, kind]
    command += ["--runs", str(runs), "--dataset", env["REPORTS_DATASET"]]
    done = subprocess.run(command, env=env, cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def print_row(kind: str, engine: str, figures: dict, baseline: dict | None) -> None:
    median = statistics.median(figures["job_s"])
    ratio = f"{median / statistics.median(baseline['job_s']):.1f}x" if baseline else ""
    print(
        f"{kind:<10} {engine:<7} {figures['startup_s']:>10.1f} {median:>9.2f} "
        f"{figures['job_s'][0]:>8.2f} {figures['peak_mb']:>8,.0f} {figures['jvm_mb']:>7,.0f} "
        f"{figures['rows']:>7,} {ratio:>9}"
    )


def print_growth(results: dict, args: argparse.Namespace) -> None:
    sizes = sorted(results)
    if len(sizes) < 2:
        return
    small, large = sizes[0], sizes[-1]
    print(f"\ngrowth from {small:,} to {large:,} records ({large / small:.0f}x the records):")
    for kind in args.reports:
        before = statistics.median(results[small][kind]["job_s"])
        after = statistics.median(results[large][kind]["job_s"])
        print(f"  {kind:<10} {before:7.2f} s -> {after:7.2f} s  ({after / before:.1f}x)")


def within_budget(results: dict, args: argparse.Namespace) -> bool:
    largest = results[max(results)]
    slow = [
        kind
        for kind, figures in largest.items()
        if statistics.median(figures["job_s"]) + figures["startup_s"] > args.budget_s
    ]
    if slow:
        print(f"\nover the {args.budget_s:.0f} s budget at {max(results):,}: {', '.join(slow)}")
    return not slow


# The child: one report on one engine, in a process of its own.


def child(args: argparse.Namespace) -> None:
    engine, kind = args.child
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()
    params = incident_window(args.dataset)
    figures = spark_child(kind, args, params) if engine == "spark" else duck_child(kind, args)
    figures["peak_mb"] = high_water_mb(os.getpid())
    figures["jvm_mb"] = sum(high_water_mb(pid) for pid in descendants(os.getpid()))
    print(json.dumps(figures))


def incident_window(dataset: Path):
    """The whole generated incident: its first event to just after its last."""
    from datetime import timedelta

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reports.results import Params

    published = pq.read_table(dataset / "events", columns=["published_at"])["published_at"]
    first, last = pc.min(published).as_py(), pc.max(published).as_py()
    return Params(window_start=first, window_end=last + timedelta(seconds=1))


def spark_child(kind: str, args: argparse.Namespace, params) -> dict:
    from reports import spark
    from reports.jobs import job

    startup = spark.warm_up()
    times, rows = [], 0
    for _ in range(args.runs):
        data = spark.Dataset(spark.session(), args.dataset)
        started = time.monotonic()
        result = job(kind).run(data, params)
        times.append(time.monotonic() - started)
        rows = sum(len(section) for section in result.sections.values())
    return {"startup_s": startup, "job_s": times, "rows": rows}


def duck_child(kind: str, args: argparse.Namespace) -> dict:
    from bench.reports_baseline import run_baseline

    params = incident_window(args.dataset)
    times, rows = [], 0
    for _ in range(args.runs):
        started = time.monotonic()
        rows = run_baseline(kind, args.dataset, params)
        times.append(time.monotonic() - started)
    return {"startup_s": 0.0, "job_s": times, "rows": rows}


def high_water_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    """The process's children, theirs, and so on (Spark's JVM among them)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


if __name__ == "__main__":
    main()
