"""Reads of the event service, split by the same domains as `broker.services` (the
writes): clients and tokens, trust, policies, events, sending, deliveries, presence,
history and audit; beside them, the reads behind the console's pages (fleet search
and its directory, reach, policy effect, why, progress, the tree's figures).

A read that more than one caller needs lives here, in its domain's module; a new
domain gets a module here and one in `broker.services`."""
