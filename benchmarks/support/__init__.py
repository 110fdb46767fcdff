"""Shared plumbing of the benchmarks, by concern: env, stats, machine, services, recorder, proxy.

Every benchmark prints markdown tables of medians with min-max over its runs, so a table can be
pasted into RESULTS.md as it is. Everything a run creates (databases, queues, exchanges,
processes) has a unique name and is removed at the end, even when the run fails.
"""
