"""`manage.py worker_queues`: the queues a tree worker consumes, all of the tree or
one subtree with the path above it (the default tree: depth 3, branching 2)."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

pytestmark = pytest.mark.django_db


def queues(*args: str) -> list[str]:
    out = StringIO()
    call_command("worker_queues", *args, stdout=out)
    return out.getvalue().strip().split(",")


def test_the_whole_tree_is_the_default_queue_and_every_dispatcher():
    assert queues() == [
        "celery", "dispatcher.d0", "dispatcher.d0.0", "dispatcher.d0.1", "dispatcher.d0.0.0",
        "dispatcher.d0.0.1", "dispatcher.d0.1.0", "dispatcher.d0.1.1",
    ]  # fmt: skip


def test_a_subtree_is_its_dispatchers_and_the_path_above_it():
    assert queues("--subtree", "d0.1") == [
        "celery", "dispatcher.d0", "dispatcher.d0.1", "dispatcher.d0.1.0", "dispatcher.d0.1.1",
    ]  # fmt: skip
    assert queues("--subtree", "d0.0.1") == [
        "celery", "dispatcher.d0", "dispatcher.d0.0", "dispatcher.d0.0.1",
    ]  # fmt: skip


def test_an_unknown_subtree_is_refused_naming_the_inner_dispatchers():
    with pytest.raises(CommandError, match=r"no dispatcher 'd9' \(inner ones: d0, d0\.0, d0\.1\)"):
        queues("--subtree", "d9")
