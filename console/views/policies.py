"""The Policy editor: write a receivers' policy with live validation, see the diff
and the effect over recent events, and save it to one client or many by selector."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST

from broker.errors import BrokerError
from broker.models import Client
from broker.reads.policies import current_policy
from broker.reads.policy_effect import current_policy_groups, policy_effect
from broker.reads.search import receivers_chosen
from broker.roles import AUTHOR_POLICIES, READ
from broker.services.policies import MAX_POLICY_LENGTH, set_policies
from broker.vocabulary import vocabulary
from console.access import actor_of, requires
from console.diffs import policy_diff
from policies import PolicySyntaxError

TEMPLATE = "console/policy_editor.html"


@dataclass
class Target:
    """The receivers a policy is written for, and the policies they have now."""

    client_name: str = ""
    selector: str = ""
    ids: list[int] = field(default_factory=list)
    error: str = ""
    current: Counter = field(default_factory=Counter)
    baseline: str = ""  # the policy most of them have, as its author wrote it


def _target(params: QueryDict) -> Target:
    target = Target(client_name=params.get("client", ""), selector=params.get("selector", ""))
    if not (target.client_name or target.selector.strip()):
        target.error = 'Choose the receivers: one client, or a selector such as software == "IIS".'
        return target
    try:
        target.ids = receivers_chosen(client_name=target.client_name, selector_text=target.selector)
    except (PolicySyntaxError, LookupError) as error:
        target.error = str(error)
        return target
    groups = current_policy_groups(set(target.ids))
    target.current = Counter({text: len(members) for text, members in groups.items()})
    commonest = max(groups.items(), key=lambda item: len(item[1]), default=(None, set()))
    if commonest[0] is not None:
        target.baseline = current_policy(Client(pk=min(commonest[1]))).text
    return target


@require_GET
@requires(READ, action="policy.view")
def editor(request: HttpRequest) -> HttpResponse:
    """The editor for the receivers chosen by `client` or `selector`."""
    target = _target(request.GET)
    context = {"target": target, "text": target.baseline, "max_length": MAX_POLICY_LENGTH}
    return render(request, TEMPLATE, context)


@require_POST
@requires(READ, action="policy.check")
def check(request: HttpRequest) -> HttpResponse:
    """Validate as the author types: the error with line and column, or the diff."""
    target = _target(request.POST)
    text = request.POST.get("policy", "")
    return render(request, f"{TEMPLATE}#check", _checked(text, target))


def _checked(text: str, target: Target) -> dict:
    context: dict = {"text": text, "target": target}
    if len(text) > MAX_POLICY_LENGTH:
        context["error"] = PolicySyntaxError(
            f"the policy is longer than {MAX_POLICY_LENGTH} characters", 1, 1
        )
    else:
        try:
            context["canonical"] = vocabulary().policy(text).text()
        except PolicySyntaxError as error:
            context["error"] = error
    context["lines"] = _annotated(text, context.get("error"))
    context["diff"] = policy_diff(target.baseline, text)
    return context


def _annotated(text: str, error: PolicySyntaxError | None) -> list[dict]:
    """The text's lines, the error's line split where its column points."""
    lines = []
    for number, line in enumerate(text.split("\n") or [""], start=1):
        entry = {"number": number, "text": line, "error": False}
        if error is not None and number == error.line:
            at = max(error.column - 1, 0)
            entry.update(error=True, before=line[:at], at=line[at:] or " ")
        lines.append(entry)
    return lines


@require_POST
@requires(READ, action="policy.preview")
def preview(request: HttpRequest) -> HttpResponse:
    """The effect of the policy over recent events, before it is saved."""
    target = _target(request.POST)
    context = _checked(request.POST.get("policy", ""), target)
    if not target.error and "error" not in context:
        new = vocabulary().policy(context["text"])
        context["effect"] = policy_effect(client_ids=set(target.ids), new=new)
    return render(request, f"{TEMPLATE}#preview", context)


@require_POST
@requires(AUTHOR_POLICIES, action="policy.set")
def save(request: HttpRequest) -> HttpResponse:
    """Save the policy as the next version of every chosen receiver (audited)."""
    target = _target(request.POST)
    text = request.POST.get("policy", "")
    if target.error:
        return render(request, f"{TEMPLATE}#saved", {"problem": target.error}, status=400)
    clients = list(Client.objects.filter(id__in=target.ids).order_by("name"))
    selection = f"client {target.client_name}" if target.client_name else target.selector
    try:
        versions = set_policies(
            clients=clients, text=text, actor=actor_of(request), selection=selection
        )
    except BrokerError as error:
        context = {"problem": error.message, "line": getattr(error, "line", None)}
        return render(request, f"{TEMPLATE}#saved", context, status=400)
    return render(request, f"{TEMPLATE}#saved", {"saved": len(versions), "target": target})
