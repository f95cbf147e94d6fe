"""The API's bodies: every request and response as pydantic models."""
