"""The bulk-recorder service: broker topology, deliveries, lifecycle and entrypoint."""
