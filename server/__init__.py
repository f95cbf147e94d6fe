"""Pressroom: an asynchronous PDF service on PostgreSQL and headless Chromium."""
