"""The properties of a copy the recorder publishes (a dead letter, or a release back to the
queue): the message's own, but for three a copy cannot carry as they were. Their original
values go in headers (docs/messages.md, "Message properties")."""

from __future__ import annotations

from typing import Any

from pamqp import commands as spec

ORIGINAL_DELIVERY_MODE_HEADER = "x-bulk-recorder-original-delivery-mode"
ORIGINAL_EXPIRATION_HEADER = "x-bulk-recorder-original-expiration"
ORIGINAL_USER_ID_HEADER = "x-bulk-recorder-original-user-id"


def copy_properties(props: spec.Basic.Properties, headers: dict[str, Any]) -> spec.Basic.Properties:
    """The copy's properties: the message's own, but for three a copy cannot carry as they were.
    It is persistent (a transient dead letter would not outlive a broker restart), has no
    ``expiration`` (the dead letter would expire) and no ``user_id`` (the broker refuses any
    other than the publishing connection's user). Their original values go in headers (the
    first copy's, on a copy of a copy); ``dlq replay`` restores the delivery mode."""
    for header, value in (
        (ORIGINAL_DELIVERY_MODE_HEADER, props.delivery_mode),
        (ORIGINAL_EXPIRATION_HEADER, props.expiration),
        (ORIGINAL_USER_ID_HEADER, props.user_id),
    ):
        if value is not None:
            headers.setdefault(header, value)
    return spec.Basic.Properties(
        headers=headers,
        content_type=props.content_type,
        content_encoding=props.content_encoding,
        message_type=props.message_type,
        message_id=props.message_id,
        correlation_id=props.correlation_id,
        reply_to=props.reply_to,
        priority=props.priority,
        timestamp=props.timestamp,
        app_id=props.app_id,
        delivery_mode=2,  # persistent
    )
