"""The demo's authenticators: made with its users, their codes printed on request, so
that the demo can be tried without a phone. Only these; a real user's authenticator
is never read out."""

from __future__ import annotations

from django_otp.oath import TOTP
from django_otp.plugins.otp_totp.models import TOTPDevice

DEMO_AUTHENTICATOR = "demo authenticator"


def demo_code(username: str) -> str | None:
    """The code `username`'s demo authenticator shows now; None if they have none."""
    device = TOTPDevice.objects.filter(
        user__username=username, name=DEMO_AUTHENTICATOR, confirmed=True
    ).first()
    if device is None:
        return None
    totp = TOTP(device.bin_key, device.step, device.t0, device.digits, device.drift)
    return f"{totp.token():0{device.digits}d}"
