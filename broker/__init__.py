"""The event service: clients, attestations, policies, the dispatcher tree, deliveries."""
