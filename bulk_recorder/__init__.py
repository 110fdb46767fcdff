"""bulk-recorder: RabbitMQ -> PostgreSQL in bulk, acked after commit; nothing lost or doubled."""

__version__ = "1.0.0"
