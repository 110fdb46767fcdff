"""Shared plumbing: database pool and migrations, broker nodes, metrics, logs, error classes,
backoff, ids, reachability checks, and the one adapter onto aiormq's internals.

Imports only ``settings`` and third-party libraries: every other package may use it.
"""
