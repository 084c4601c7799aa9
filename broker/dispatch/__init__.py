"""The dispatcher tree at work: per-process state rebuilt from PostgreSQL, subtree
summaries, and the routing steps the Celery tasks run."""
