"""WebSocket routes of the console."""

from django.urls import path

from console.consumers import ServerTimeConsumer

websocket_urlpatterns = [
    path("ws/time/", ServerTimeConsumer.as_asgi(), name="ws-time"),
]
