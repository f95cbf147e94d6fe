"""What leaves Pressroom after a job: webhooks from the outbox, and the links to a job's files."""
