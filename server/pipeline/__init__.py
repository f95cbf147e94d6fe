"""The work itself: a job's render, a batch's join, and the secrets a job carries between them."""
