"""The Dispatcher tree page: the topology with each dispatcher's figures, live."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from broker.dispatch.transport import inbox_depths
from broker.reads.tree import DEEP_INBOX, MANY_WASTED, WASTED_SHARE, tree_figures
from broker.roles import READ
from console.access import requires


@require_GET
@requires(READ, action="tree.view")
def tree(request: HttpRequest) -> HttpResponse:
    """The tree, or (for htmx, when the `tree` topic is announced) just its body."""
    template = "console/tree.html#body" if request.htmx else "console/tree.html"
    context = {
        "tree": tree_figures(inboxes=inbox_depths()),
        "deep_inbox": DEEP_INBOX,
        "many_wasted": MANY_WASTED,
        "wasted_share": int(WASTED_SHARE * 100),
    }
    return render(request, template, context)
