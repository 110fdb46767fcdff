"""The recorder's pipeline: collector (batches), flusher (write, settle, isolate), writer (SQL).

May import ``settings``, ``bulk_recorder.infra`` and ``bulk_recorder.records``.
"""
