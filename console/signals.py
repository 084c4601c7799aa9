"""Operators' logins and logouts go to the audit log (the receivers only record)."""

from axes.signals import user_locked_out
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import post_migrate
from django.dispatch import receiver

from broker import audit


def _operator(username: str) -> audit.Actor:
    return audit.Actor("user", username or "anonymous")


@receiver(user_logged_in)
def audit_login(sender, request, user, **kwargs) -> None:
    audit.record_change(
        actor=_operator(user.get_username()), action="console.login", target="console"
    )


@receiver(user_logged_out)
def audit_logout(sender, request, user, **kwargs) -> None:
    """A logout, or the end of a session that ended (console.sessions.EndSessions
    logged its user out, and says why on the request)."""
    if user is None:
        return
    ended = getattr(request, "session_ended", None)
    audit.record_change(
        actor=_operator(user.get_username()),
        action="console.logout" if ended is None else "console.session_end",
        target="console",
        details=None if ended is None else ended.audit_details(),
    )


@receiver(user_login_failed)
def audit_failed_login(sender, credentials, request=None, **kwargs) -> None:
    if getattr(request, "axes_locked_out", False):
        return  # refused for the lockout, whatever the password: audit_lockout records it
    audit.record_refusal(
        actor=_operator(credentials.get("username", "")),
        action="console.login",
        target="console",
        reason="wrong username or password",
    )


@receiver(user_locked_out)
def audit_lockout(sender, request, username, ip_address, **kwargs) -> None:
    """Each login refused because its username or address is locked out (django-axes
    sends this for the failure that locks, and for every attempt while locked)."""
    audit.record_refusal(
        actor=_operator(username or ""),
        action="console.login",
        target="console",
        reason=f"locked out: too many failed logins for {username!r} or from {ip_address}",
        details={"address": ip_address, "locked_out": True},
    )


@receiver(post_migrate)
def sync_roles_after_migrating(sender, **kwargs) -> None:
    """The roles' groups follow the code: after the broker's and the reports' permissions
    exist (the same signal creates them, app by app; reports is the last of the two in
    INSTALLED_APPS)."""
    if sender.name == "reports":
        from broker.roles import sync_roles

        sync_roles()
