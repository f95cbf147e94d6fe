"""The `pressroom` command: the operator's commands (admin) and the client's (commands)."""
