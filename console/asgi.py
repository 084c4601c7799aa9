"""ASGI entry point: HTTP through Django, WebSockets through Channels (Redis layer)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
# Django must be set up before anything imports models (consumers, routing).
django_http_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from console.processes import Role, announce_forever  # noqa: E402
from console.routing import agent_urlpatterns, websocket_urlpatterns  # noqa: E402
from console.runtime import (  # noqa: E402
    skip_autobahn_debug_formatting,
    tune_garbage_collector,
)

# Agents are programs that log in with a token inside the socket: no cookies, hence no
# cross-site risk, and no Origin header to check. The operators' sockets are the
# browser's, authenticated by the session cookie, and must come from our own pages.
application = ProtocolTypeRouter(
    {
        "http": django_http_app,
        "websocket": URLRouter(
            [
                *agent_urlpatterns,
                re_path(
                    r"",
                    AllowedHostsOriginValidator(
                        AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
                    ),
                ),
            ]
        ),
    }
)

skip_autobahn_debug_formatting()
announce_forever(Role.WEB)  # on the health page, with its host and pid
# Last: everything built so far lives as long as the process.
tune_garbage_collector()
