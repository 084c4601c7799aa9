"""Who may open a page or take an action: every view says what permission it needs.

A refusal is answered with a page (or an htmx fragment) that says which role the action
needs, and is written to the audit log with who tried what, where.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import urlencode

from broker import audit
from broker.audit import Actor
from broker.roles import needs_second_factor, role_needed_for

View = Callable[..., HttpResponse]


def actor_of(request: HttpRequest) -> Actor:
    """The logged-in operator as the audit log names them."""
    return Actor("user", request.user.get_username())


def requires(permission: str, *, action: str) -> Callable[[View], View]:
    """Let the view run only for a logged-in user holding `permission`; anyone else
    logged in is refused (403) and the refusal is audited as `action`."""

    def decorate(view: View) -> View:
        @wraps(view)
        def checked(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not request.user.has_perm(permission):
                return refuse(request, permission=permission, action=action)
            return view(request, *args, **kwargs)

        return checked

    return decorate


def refuse(request: HttpRequest, *, permission: str, action: str) -> HttpResponse:
    """Answer 403 saying which role is needed, and audit the attempt."""
    role = role_needed_for(permission)
    reason = f"{request.user.get_username()} lacks the {role} role ({permission})"
    audit.record_refusal(
        actor=actor_of(request),
        action=action,
        target=request.path[: audit.SHORT_TEXT],
        reason=reason,
        details={"method": request.method, "category": audit.ROLE_REFUSED},
    )
    context = {"role": role, "action": action}
    template = "console/forbidden.html#refusal" if request.htmx else "console/forbidden.html"
    return render(request, template, context, status=403)


# When the session's user last typed a code of their second factor (a Unix time).
CODE_TYPED_AT = "second_factor_at"


def note_code_typed(request: HttpRequest) -> None:
    """Remember that a code was typed just now in this session."""
    request.session[CODE_TYPED_AT] = time.time()


def has_fresh_code(request: HttpRequest) -> bool:
    """Whether a code was typed in this session within SECOND_FACTOR_FRESH_MIN."""
    typed_at = request.session.get(CODE_TYPED_AT, 0)
    return time.time() - typed_at < settings.SECOND_FACTOR_FRESH_MIN * 60


def lacks_second_factor(request: HttpRequest) -> bool:
    """Whether the session's user must prove a second factor and has not."""
    user = request.user
    return needs_second_factor(user) and not user.is_verified()


def requires_fresh_code(view: View) -> View:
    """Let the view act only if a code was typed recently; else answer 403 with a form
    asking for one (the action is then repeated). For what a stolen session must not
    do alone: large sends, trust changes, key rotations, grants."""

    @wraps(view)
    def checked(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        if has_fresh_code(request):
            return view(request, *args, **kwargs)
        return fresh_code_form(request)

    return checked


def second_factor_url(*, next_page: str, again: bool) -> str:
    """The second factor's page, going on to `next_page` once a code is typed
    (`again`: asked of a session that proved it before, for a fresh code)."""
    query = {"next": next_page, **({"again": "1"} if again else {})}
    return f"{reverse('second-factor')}?{urlencode(query)}"


def fresh_code_form(request: HttpRequest) -> HttpResponse:
    """403 with a form asking for a fresh code (in place, for htmx; else the second
    factor's page, which comes back here)."""
    if not request.htmx:
        # Back to the page the form was on (the action itself is a POST): it is
        # pressed again there.
        back = urlsplit(request.META.get("HTTP_REFERER", ""))
        same_site = back.netloc == request.get_host()
        return redirect(second_factor_url(next_page=back.path if same_site else "/", again=True))
    context = {"fresh_min": settings.SECOND_FACTOR_FRESH_MIN}
    return render(request, "console/second_factor.html#again", context, status=403)
