"""WebSocket routes of the console."""

from django.urls import path

from broker.consumers import AgentConsumer
from console.consumers import ConsoleConsumer

agent_urlpatterns = [
    path("ws/agent/v1/", AgentConsumer.as_asgi(), name="ws-agent"),
]

websocket_urlpatterns = [
    path("ws/console/", ConsoleConsumer.as_asgi(), name="ws-console"),
]
