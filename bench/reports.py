"""The five reports on Spark over 1,000,000 and 10,000,000 delivery records, as the
reports worker runs them in its warm session, beside the same reports in one process
with DuckDB over the 1,000,000.

Run as a module from the repository root, with the project's interpreter (.venv/bin/python):

    python -m bench.reports                          # 1M and 10M, 3 runs of each job
    python -m bench.reports --sizes 1000000 --runs 2
    python -m bench.reports --reuse                  # keep (and reuse) generated data

For each size, a database of its own in a private PostgreSQL under var/bench-reports
(unless DATABASE_URL / REDIS_URL are set) is filled by `manage.py generate_traffic`
(100,000 servers, the incident sized to the delivery records asked), then exported to
a Parquet dataset of its own by `manage.py export_dataset`: both are timed.

Then each report runs in a process of its own, so that its memory is its own: the
process starts Spark (local[*], SPARK_DRIVER_MEMORY, default 4g here) and reads the
dataset into memory, as the reports worker does as it starts (reports.runner.warm_up),
and says how long that took, then computes the report as a run of the reports worker does
(reports.runner.compute): --runs times over the whole incident's window (the first run
of the session, then warm ones), then --runs - 1 times (at least once) over the
incident's second half (the window changed) and as often over the whole incident for
one region (the region changed), those two in turn. Printed per report: that start-up;
the first run, and the medians of the warm runs, the changed window and the changed
region (single runs on a shared machine move by a third); the median of the runs over
the whole incident after an export (EXPORTS batches of ANSWERS_PER_EXPORT answers each,
written beside the dataset as an export writes them, each followed by one run: what the
worker's kept frames cost an operator's first run after new answers came in; printed,
not judged); what the last warm run asked
of Spark (jobs, stages run, tasks, MB read from files or cache, MB shuffled); the peak
resident memory of the process and of Spark's JVM; the rows returned. DuckDB runs the
same reports and runs in one process over the same Parquet files
(bench/reports_baseline.py), on the 1,000,000 only; the ratio is Spark's over DuckDB's,
for the slowest of the warm, window and region runs. Last, how each report's warm run
grew from the smallest size to the largest.

Exits 1 unless every report, in a warm session, took at most --warm-budget-s (3 s) and
--ratio-budget (10x) DuckDB's time (where DuckDB ran) over up to 1,000,000 delivery
records, for the warm runs, the changed window and the changed region alike; at most
--large-budget-s (20 s) for those runs over more; and at most --budget-s (180 s) for
start-up and first run anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

from bench.services import fresh_database, run_in_process
from reports.dataset import TABLES, batch_number, batches, in_current_layout

ROOT = Path(__file__).resolve().parent.parent

FOLDER = ROOT / "var" / "bench-reports"
KINDS = ("timeline", "reach", "audit", "tree", "latency")


CONVERSATIONAL_SIZE = 1_000_000  # delivery records: up to here, 3 s and 10x DuckDB's time


def arguments(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.reports", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--servers", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="over the whole incident")
    parser.add_argument("--reports", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--baseline-size", type=int, default=1_000_000)
    parser.add_argument("--budget-s", type=float, default=180.0)
    parser.add_argument("--warm-budget-s", type=float, default=3.0)
    parser.add_argument("--ratio-budget", type=float, default=10.0)
    parser.add_argument("--large-budget-s", type=float, default=20.0)
    parser.add_argument("--reuse", action="store_true")
    parser.add_argument("--child", nargs=2, metavar=("ENGINE", "REPORT"), help=argparse.SUPPRESS)
    parser.add_argument("--dataset", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--answers", type=Path, help=argparse.SUPPRESS)
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
    if args.reuse and done_mark.exists() and in_current_layout(Path(env["REPORTS_DATASET"])):
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


# A child's runs, in order: the whole incident --runs times (the first run of the
# session, then the warm ones: "whole"), then its second half ("window") and one region
# ("region") in turn, --runs - 1 times each (at least once).
WARM_RUNS = ("warm", "window", "region")


def measure(args: argparse.Namespace, env: dict[str, str], size: int) -> dict:
    """Every report on Spark, and on DuckDB at the baseline's size; printed as it goes."""
    answers = written_answers(Path(env["REPORTS_DATASET"]))
    print(
        f"{'report':<9} {'engine':<6} {'start s':>7} {'first s':>7} {'warm s':>6} "
        f"{'window s':>8} {'region s':>8} {'export s':>8} {'jobs':>4} {'stages':>6} {'tasks':>5} "
        f"{'read MB':>7} {'shuffle MB':>10} {'peak MB':>7} {'JVM MB':>6} {'rows':>6} "
        f"{'vs DuckDB':>9}"
    )
    figures = {}
    for kind in args.reports:
        spark = in_child(env, "spark", kind, args.runs, answers)
        duck = in_child(env, "duckdb", kind, args.runs) if size == args.baseline_size else None
        spark["ratio"] = slowest_ratio(spark, duck) if duck else None
        print_row(kind, "spark", spark)
        if duck:
            print_row(kind, "duckdb", duck)
        figures[kind] = spark
    return figures


def in_child(
    env: dict[str, str], engine: str, kind: str, runs: int, answers: Path | None = None
) -> dict:
    command = [sys.executable, "-m", "bench.reports", "--child", engine, kind]
    command += ["--runs", str(runs), "--dataset", env["REPORTS_DATASET"]]
    command += ["--answers", str(answers)] if answers else []
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(_failure(engine, kind, done))
    return json.loads(done.stdout.strip().splitlines()[-1])


def _failure(engine: str, kind: str, done: subprocess.CompletedProcess) -> str:
    """What a child that failed said: its error lines (all it wrote kept in a file)."""
    log = FOLDER / f"{engine}-{kind}.stderr"
    log.write_text(done.stderr)
    lines = done.stderr.splitlines()
    errors = [line for line in lines if "Error" in line or "Exception" in line][:10]
    said = "\n".join(errors or lines[-20:])
    return f"{engine} {kind} failed (exit {done.returncode}; all it wrote: {log}):\n{said}"


def seconds_of(figures: dict, run: str) -> float:
    """The first run's seconds, or the median of the warm runs ("warm": the whole
    incident's after the first), of the window's or of the region's."""
    runs = figures["runs"]
    if run == "first":
        return runs[0]["s"]
    if run == "warm":
        whole = [one["s"] for one in runs if one["run"] == "whole"]
        return statistics.median(whole[1:] or whole)
    return statistics.median(one["s"] for one in runs if one["run"] == run)


def slowest_ratio(spark: dict, duck: dict) -> float:
    """Spark's time over DuckDB's, the largest of the warm, window and region runs."""
    return max(seconds_of(spark, run) / seconds_of(duck, run) for run in WARM_RUNS)


def print_row(kind: str, engine: str, figures: dict) -> None:
    work = [one for one in figures["runs"] if one["run"] == "whole"][-1]
    ratio = f"{figures['ratio']:.1f}x" if figures.get("ratio") else ""
    times = [seconds_of(figures, run) for run in ("first", *WARM_RUNS)]
    exported = [one["s"] for one in figures["runs"] if one["run"] == "export"]
    after = f"{statistics.median(exported):.2f}" if exported else ""
    print(
        f"{kind:<9} {engine:<6} {figures['startup_s']:>7.1f} {times[0]:>7.2f} {times[1]:>6.2f} "
        f"{times[2]:>8.2f} {times[3]:>8.2f} {after:>8} "
        f"{work.get('jobs', ''):>4} {work.get('stages', ''):>6} "
        f"{work.get('tasks', ''):>5} {work.get('read_mb', ''):>7} {work.get('shuffle_mb', ''):>10} "
        f"{figures['peak_mb']:>7,.0f} {figures['jvm_mb']:>6,.0f} {figures['rows']:>6,} {ratio:>9}"
    )


def print_growth(results: dict, args: argparse.Namespace) -> None:
    sizes = sorted(results)
    if len(sizes) < 2:
        return
    small, large = sizes[0], sizes[-1]
    print(f"\ngrowth of the warm run from {small:,} to {large:,} records ({large / small:.0f}x):")
    for kind in args.reports:
        before = seconds_of(results[small][kind], "warm")
        after = seconds_of(results[large][kind], "warm")
        print(f"  {kind:<10} {before:7.2f} s -> {after:7.2f} s  ({after / before:.1f}x)")


def within_budget(results: dict, args: argparse.Namespace) -> bool:
    """Whether every report met the issue's figures (see the module's docstring)."""
    misses = []
    for size, reports in sorted(results.items()):
        for kind, figures in reports.items():
            misses += [f"{size:,} {kind}: {miss}" for miss in budget_misses(figures, size, args)]
    for miss in misses:
        print(f"over budget: {miss}")
    if not misses:
        print("\nevery report within its budgets")
    return not misses


def budget_misses(figures: dict, size: int, args: argparse.Namespace) -> list[str]:
    cold = figures["startup_s"] + seconds_of(figures, "first")
    misses = [f"start-up and first run {cold:.1f} s"] if cold > args.budget_s else []
    # The figures hold by size: a conversation's pace up to a million deliveries,
    # 20 s over ten million (whichever size DuckDB ran on).
    conversational = size <= CONVERSATIONAL_SIZE
    limit = args.warm_budget_s if conversational else args.large_budget_s
    for run in WARM_RUNS:
        took = seconds_of(figures, run)
        if took > limit:
            misses.append(f"{run} run {took:.2f} s > {limit:.0f} s")
    if conversational and figures.get("ratio") and figures["ratio"] > args.ratio_budget:
        misses.append(f"{figures['ratio']:.1f}x DuckDB's time")
    return misses


# The child: one report on one engine, in a process of its own.


def child(args: argparse.Namespace) -> None:
    engine, kind = args.child
    import django

    runs = planned_runs(args.dataset, args.runs)
    if engine == "spark":
        with linked_copy(args.dataset) as session_dataset:  # the answers go in the copy
            os.environ["REPORTS_DATASET"] = str(session_dataset)
            _django_setup(django)
            figures = spark_child(kind, runs, args.answers)
    else:
        _django_setup(django)
        figures = duck_child(kind, args, runs)
    figures["peak_mb"] = high_water_mb(os.getpid())
    figures["jvm_mb"] = sum(high_water_mb(pid) for pid in descendants(os.getpid()))
    print(json.dumps(figures))


def planned_runs(dataset: Path, whole_runs: int) -> list[tuple[str, object]]:
    """The runs, each as its label and its parameters: the whole incident `whole_runs`
    times, then its second half and the whole incident for its most populous region in
    turn, `whole_runs - 1` times each (at least once)."""
    from dataclasses import replace

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from reports.results import Params

    published = pq.read_table(dataset / "events", columns=["published_at"])["published_at"]
    first, last = pc.min(published).as_py(), pc.max(published).as_py()
    whole = Params(window_start=first, window_end=last + timedelta(seconds=1))
    half = replace(whole, window_start=first + (whole.window_end - first) / 2)
    regions = pq.read_table(dataset / "clients", columns=["region"])["region"]
    counts = pc.value_counts(regions.drop_null()).to_pylist()
    region = max(counts, key=lambda count: count["counts"])["values"]
    changed = [("window", half), ("region", replace(whole, region=region))]
    return [("whole", whole)] * whole_runs + changed * max(1, whole_runs - 1)


def _django_setup(django) -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    django.setup()


def spark_child(kind: str, runs: list, answers: Path | None) -> dict:
    from reports import spark
    from reports.export import dataset_root
    from reports.runner import compute, warm_up

    startup = warm_up()
    figures, rows = [], 0
    for label, params in runs:
        with SparkWork(spark.session()) as work:
            result = compute(kind, params)
        figures.append({"run": label, **work.figures})
        rows = rows or sum(len(section) for section in result.sections.values())
    for batch in _in_export_order(answers):
        link_batch(batch, dataset_root() / batch.parent.name)
        if batch.parent.name != "deliveries":
            continue  # an export's two tables in, then the run
        with SparkWork(spark.session()) as work:
            compute(kind, runs[0][1])
        figures.append({"run": "export", **work.figures})
    return {"startup_s": startup, "runs": figures, "rows": rows}


def duck_child(kind: str, args: argparse.Namespace, runs: list) -> dict:
    from bench.reports_baseline import run_baseline

    figures, rows = [], 0
    for label, params in runs:
        started = time.monotonic()
        found = run_baseline(kind, args.dataset, params)
        figures.append({"run": label, "s": time.monotonic() - started})
        rows = rows or found
    return {"startup_s": 0.0, "runs": figures, "rows": rows}


# An export's worth of answers: what the reports worker's kept frames take in before an
# operator's run, during an incident.
EXPORTS = 2
ANSWERS_PER_EXPORT = 1_000


def written_answers(dataset: Path) -> Path:
    """EXPORTS batches of ANSWERS_PER_EXPORT answers each, written as an export writes
    them (the deliveries acknowledged, an audit entry each), in a folder beside the
    dataset; each batch answers deliveries of its own, the newest not answered yet."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    folder = dataset.parent / f"{dataset.name}-answers"
    if folder.exists():
        shutil.rmtree(folder)
    deliveries = pq.read_table(dataset / "deliveries").drop(["batch"])
    audit = pq.read_table(dataset / "audit", columns=["id"])
    names = pq.read_table(dataset / "clients", columns=["id", "name"]).to_pydict()
    clients = dict(zip(names["id"], names["name"], strict=True))
    chosen = _unanswered_newest(deliveries, EXPORTS * ANSWERS_PER_EXPORT)
    first_batch = batch_number(batches(dataset / "deliveries")[-1]) + 1
    next_entry = pc.max(audit["id"]).as_py() + 1
    for n in range(EXPORTS):
        share = chosen[n * ANSWERS_PER_EXPORT : (n + 1) * ANSWERS_PER_EXPORT]
        batch = first_batch + n
        acked = [_acked(row, batch) for row in share]
        entries = [_ack_entry(row, next_entry + i, clients, batch) for i, row in enumerate(acked)]
        next_entry += len(entries)
        _write_batch(folder, "deliveries", batch, acked)
        _write_batch(folder, "audit", batch, entries)
    return folder


def _unanswered_newest(deliveries, count: int) -> list[dict]:
    """The `count` newest deliveries not answered yet (the newest others after them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    waiting = pc.is_in(deliveries["state"], pa.array(["pending", "delivered"]))
    order = [("waiting", "descending"), ("id", "descending")]
    ranked = deliveries.append_column("waiting", waiting).sort_by(order)
    return ranked.slice(0, count).drop(["waiting"]).to_pylist()


def _acked(row: dict, batch: int) -> dict:
    seen = row["received_at"] or row["delivered_at"] or row["published_at"]
    answered = seen + timedelta(seconds=1)
    return {**row, "state": "acked", "received_at": seen, "acked_at": answered, "txid": batch}


def _ack_entry(row: dict, entry_id: int, clients: dict, batch: int) -> dict:
    return {
        "id": entry_id, "at": row["acked_at"], "actor": f"client:{clients[row['receiver_id']]}",
        "action": "delivery.ack", "target": f"delivery:{row['id']}", "outcome": "done",
        "reason": "", "category": None, "details": "{}", "txid": batch,
    }  # fmt: skip


def _write_batch(folder: Path, table: str, batch: int, rows: list[dict]) -> None:
    """`rows` of `table` as an export writes a batch of it, under `folder`."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    written = folder / table / f"batch={batch}"
    written.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist(rows, schema=TABLES[table].schema), written / "part-0.parquet"
    )


def _in_export_order(answers: Path | None) -> list[Path]:
    """The answers' batches, oldest first, each export's audit batch before its
    deliveries' (the run follows the deliveries')."""
    found = answers.glob("*/batch=*") if answers else []
    return sorted(found, key=lambda batch: (batch_number(batch), batch.parent.name))


@contextmanager
def linked_copy(dataset: Path) -> Iterator[Path]:
    """A copy of the dataset's folders whose files are links to the dataset's (no bytes
    copied), removed after: batches added to it leave the dataset as generated."""
    copy = dataset.parent / f"{dataset.name}-session-{os.getpid()}"
    shutil.copytree(dataset, copy, copy_function=os.link)
    try:
        yield copy
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def link_batch(batch: Path, table: Path) -> None:
    """The batch folder `batch` in the table's folder `table`, its files linked."""
    shutil.copytree(batch, table / batch.name, copy_function=os.link)


class SparkWork:
    """Times what runs inside it and counts what it asked of Spark: jobs, stages run
    (skipped ones left out), their tasks, bytes read (from files or cached blocks) and
    bytes shuffled; from Spark's own status store."""

    def __init__(self, session) -> None:
        self.context = session.sparkContext
        self.group = f"bench-{time.monotonic_ns()}"
        self.figures: dict = {}

    def __enter__(self) -> SparkWork:
        self.context.setJobGroup(self.group, "bench")
        self.started = time.monotonic()
        return self

    def __exit__(self, *_) -> None:
        self.figures["s"] = time.monotonic() - self.started
        self.context._jsc.sc().listenerBus().waitUntilEmpty()  # the store is up to date
        self.figures.update(self._counted())

    def _counted(self) -> dict:
        tracker = self.context.statusTracker()
        store = self.context._jsc.sc().statusStore()
        jobs = tracker.getJobIdsForGroup(self.group)
        stage_ids = {stage for job in jobs for stage in tracker.getJobInfo(job).stageIds}
        stages = [store.lastStageAttempt(stage) for stage in sorted(stage_ids)]
        ran = [stage for stage in stages if stage.status().toString() != "SKIPPED"]
        return {
            "jobs": len(jobs),
            "stages": len(ran),
            "tasks": sum(stage.numTasks() for stage in ran),
            "read_mb": round(sum(stage.inputBytes() for stage in ran) / 1e6, 1),
            "shuffle_mb": round(sum(stage.shuffleReadBytes() for stage in ran) / 1e6, 1),
        }


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
