"""What a broker that is away looks like to aio-pika and aiormq.

One tuple for every loop that connects to RabbitMQ (the recorder, the relay, the DLQ tools), so
that they all treat the same failures as "reconnect later" rather than as a crash.
"""

from __future__ import annotations

import aiormq

# StopAsyncIteration and EOFError: when the peer closes the socket (FIN) right after accepting it,
# as a proxy or a load balancer with no healthy backend does, aiormq's frame reader finds the
# stream at EOF before the first frame and raises StopAsyncIteration out of connect(); a close in
# the middle of a frame surfaces as IncompleteReadError (an EOFError). RuntimeError: aiormq's
# "connection closed" paths on a channel whose connection has gone.
BROKER_ERRORS: tuple[type[BaseException], ...] = (
    aiormq.exceptions.AMQPError,
    ConnectionError,
    OSError,
    TimeoutError,
    EOFError,
    StopAsyncIteration,
    RuntimeError,
)
