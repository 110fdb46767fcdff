"""Operator tools and demos: the load generator (``publish``), ``demo`` (direct and via the API)
and the DLQ tool. They build on the service's modules; the service never imports them (only the
CLI does, to run them)."""
