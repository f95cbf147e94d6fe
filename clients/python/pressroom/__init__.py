"""Pressroom's Python client: it imports nothing of the server."""

from pressroom.client import AsyncClient, PressroomError, PressroomUnavailable
from pressroom.sync import Client

__all__ = ["AsyncClient", "Client", "PressroomError", "PressroomUnavailable"]
