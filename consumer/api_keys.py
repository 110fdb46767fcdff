"""``bulk-recorder api-key create|list|revoke``: the ingest API's keys, in ``api_keys``.

``create NAME [--scope S ...]`` prints the new key once, on stdout alone (so that
``KEY=$(bulk-recorder api-key create shop)`` works); only its SHA-256 is stored, so it can never
be shown again. ``list`` shows every key without its secret. ``revoke NAME|ID`` revokes every
live key of a client (asking first when there are several, unless ``--yes``), or one key by
its id; the API refuses it from its next request on. ``list --json`` is one JSON array.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from bulk_recorder.producer.key_store import (
    DEFAULT_SCOPES,
    SCOPES,
    ApiKey,
    create_key,
    list_keys,
    revoke_keys,
)
from consumer.arguments import confirmed

# The drivers when the command runs: `bulk-recorder --help` builds this parser.
if TYPE_CHECKING:
    from settings import Settings


def add_parser(sub: Any) -> None:
    """The ``api-key`` sub-command and its own sub-commands."""
    keys = sub.add_parser("api-key", help="create, list or revoke the ingest API's keys")
    keys_sub = keys.add_subparsers(dest="key_command", required=True)
    create = keys_sub.add_parser(
        "create", help="make a key for client NAME and print it once (only its hash is kept)"
    )
    create.add_argument("name", help="the client; keys under one name share its jobs")
    create.add_argument(
        "--scope",
        action="append",
        choices=SCOPES,
        dest="scopes",
        help=f"repeat for several (default: {' '.join(DEFAULT_SCOPES)}); admin reads every job",
    )
    listing = keys_sub.add_parser(
        "list", help="every key: id, client, prefix, scopes, created, revoked"
    )
    listing.add_argument("--json", action="store_true", help="one JSON array, for scripts")
    revoke = keys_sub.add_parser(
        "revoke", help="revoke every live key of client NAME, or one key by its ID"
    )
    revoke.add_argument("name_or_id", metavar="NAME|ID", help="a client's name, or one key's id")
    revoke.add_argument(
        "--yes", action="store_true", help="revoke several keys of a client without asking"
    )


def cmd_api_key(settings: Settings, args: argparse.Namespace) -> int:
    from consumer.runner import run_async

    return run_async(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    from bulk_recorder.infra import pg_hosts
    from bulk_recorder.infra.migrate import migrate

    await migrate(settings.database_url)  # the api_keys table, on a fresh install too
    conn = await pg_hosts.connect(settings.database_url)  # every host of the list, as migrate
    try:
        if args.key_command == "create":
            # an ApiKeyRefused (a bad name or scope: exit 2) ends the command in cli.main
            stored, key = await create_key(conn, args.name, args.scopes or DEFAULT_SCOPES)
            print(
                f"API key {stored.id} for client {stored.name!r}, scopes "
                f"{' '.join(stored.scopes)}; it is shown once, store it now:",
                file=sys.stderr,
            )
            print(key)
            return 0
        if args.key_command == "list":
            keys = await list_keys(conn)
            if args.json:
                print(json.dumps([_as_json(k) for k in keys], indent=2))
                return 0
            print(f"{'id':36}  {'client':20}  {'prefix':12}  {'scopes':44}  created / revoked")
            for k in keys:
                revoked = f"  REVOKED {k.revoked_at:%Y-%m-%d %H:%M}" if k.revoked_at else ""
                print(
                    f"{k.id!s:36}  {k.name:20}  {k.prefix:12}  {','.join(k.scopes):44}  "
                    f"{k.created_at:%Y-%m-%d %H:%M}{revoked}"
                )
            return 0
        live = [k for k in await list_keys(conn) if k.revoked_at is None]
        several = [k for k in live if k.name == args.name_or_id]
        question = f"revoke all {len(several)} live keys of client {args.name_or_id!r}? [y/N] "
        if len(several) > 1 and not args.yes and not confirmed(question):
            print("nothing revoked", file=sys.stderr)
            return 1
        for k in await revoke_keys(conn, args.name_or_id):
            print(f"revoked {k.id} (client {k.name!r}, {k.prefix}...)")
        return 0
    finally:
        await conn.close()


def _as_json(key: ApiKey) -> dict[str, Any]:
    revoked = key.revoked_at.isoformat() if key.revoked_at else None
    return {
        "id": str(key.id),
        "client": key.name,
        "prefix": key.prefix,
        "scopes": list(key.scopes),
        "created_at": key.created_at.isoformat(),
        "revoked_at": revoked,
    }
