"""bulk-recorder: RabbitMQ -> PostgreSQL in bulk, acked after commit, nothing lost, nothing doubled."""

__version__ = "0.1.0"
