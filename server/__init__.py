"""Pressroom: an asynchronous PDF service on PostgreSQL and headless Chromium."""

from __future__ import annotations

import functools
import importlib.metadata


@functools.cache
def version() -> str:
    """The installed distribution's version, read once: importlib.metadata scans the path's
    distributions on every call (about 1 ms; every job's provenance and cache key name it)."""
    try:
        return importlib.metadata.version("pressroom")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"
