"""The exception hierarchy that decides whether a failed job is retried."""


class RenderError(Exception):
    """A job attempt failed. Subclasses say whether another attempt can succeed."""

    retryable = True


class TransientError(RenderError):
    """Worth another attempt: a crashed or hung browser, a storage or database hiccup."""

    retryable = True


class PermanentError(RenderError):
    """Another attempt would fail the same way: a template error, invalid options."""

    retryable = False


class StorageError(TransientError):
    """The file store refused or failed a read or write."""
