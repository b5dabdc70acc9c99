"""Real processes where the process is the point: the CLI, start-up and stop, crashes, orphans, PostgreSQL, Redis."""
