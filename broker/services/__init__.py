"""Writes of the event service. Each function validates, authorises, writes in one
transaction with its audit entry, and records refusals even when nothing is written."""
