"""Pushing over the channel layer (Redis): deliveries to agents' connections
(`to_agents`), and "what you watch changed" to operators' consoles (`to_consoles`);
`layer` is the channel layer both go through; `outages` tells a Redis or PostgreSQL
outage once per process in the log."""
