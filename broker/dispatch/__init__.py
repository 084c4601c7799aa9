"""The dispatcher tree at work.

- `entry`: what the rest of the app calls (an event published, a client changed).
- `steps`: one routing step at one dispatcher, and summary propagation (run by the
  Celery tasks of broker/tasks.py, the only module outside this package to import it).
- `wakeups`: waking dispatchers by enqueuing their tasks by name, and the sweep.
- `state`: per-process state rebuilt from PostgreSQL; `summary`: subtree summaries;
  `routed`: events as routing sees them; `delivery`: matching and delivering at a leaf.
- `queues`: the dispatchers' names and Celery queues; `backlog`: work left to do.
"""
