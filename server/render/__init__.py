"""HTML to PDF: a job's source, Jinja templates, Chromium, and the egress gate on its network."""
