"""Pressroom's Python client: it imports nothing of the server."""

from pressroom.client import AsyncClient, Client, PressroomError

__all__ = ["AsyncClient", "Client", "PressroomError"]
