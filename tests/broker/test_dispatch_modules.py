"""How the dispatcher tree's modules depend on one another, and the task names the
beat and running workers rely on."""

from __future__ import annotations

import ast
from pathlib import Path

from django.conf import settings

from broker.dispatch import wakeups
from console.celery import app

BROKER = Path(__file__).resolve().parents[2] / "broker"


def _module_name(path: Path) -> str:
    parts = path.relative_to(BROKER.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def _imports(path: Path, known: set[str]) -> set[str]:
    """The broker modules `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found & known


def _import_graph() -> dict[str, set[str]]:
    paths = [p for p in BROKER.rglob("*.py") if "migrations" not in p.parts]
    known = {_module_name(p) for p in paths}
    return {_module_name(p): _imports(p, known) - {_module_name(p)} for p in paths}


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), list(graph[start])
    while todo:
        module = todo.pop()
        if module == goal:
            return True
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return False


def test_no_broker_module_imports_itself_through_others():
    graph = _import_graph()
    assert [module for module in graph if _reaches(graph, module, module)] == []


def test_only_the_tasks_module_imports_the_dispatch_steps_from_outside_the_package():
    graph = _import_graph()
    outside = {m for m in graph if not m.startswith("broker.dispatch")}
    assert {m for m in outside if "broker.dispatch.steps" in graph[m]} == {"broker.tasks"}
    assert not any("broker.tasks" in graph[m] for m in graph if m.startswith("broker.dispatch"))


def test_one_file_name_per_meaning_for_the_tree():
    assert not (BROKER / "routing.py").exists()
    assert not (BROKER / "dispatch" / "routing.py").exists()


def test_tasks_sent_by_name_and_scheduled_by_the_beat_are_registered():
    app.loader.import_default_modules()
    sent = {wakeups.APPLY_CLIENT_CHANGES, wakeups.REFRESH_SUMMARY}
    scheduled = {entry["task"] for entry in settings.CELERY_BEAT_SCHEDULE.values()}
    assert sent | scheduled <= set(app.tasks)
    assert sent == {"broker.apply_client_changes", "broker.refresh_summary"}
