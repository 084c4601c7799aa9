"""Starts the console and its test suite on a fresh machine.

`./run` and `./test` call `python -m launcher run|test`: they start a private, real
PostgreSQL and Redis under var/ when DATABASE_URL / REDIS_URL are not set, and then the
web server and workers (run) or pytest (test). `run` (and `services`) keep what they
started running: see launcher.supervisor. Nothing here imports Django.
"""
