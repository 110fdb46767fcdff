"""The producer side: the ingest API, job intake and staging, the outbox and its relay.

May import ``settings``, ``bulk_recorder.infra``, ``bulk_recorder.records`` and the recorder's
writer (the API's ``recorded`` mode writes through it); the recorder never imports it.
"""
