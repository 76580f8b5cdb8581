"""`stepwise keys`: API keys kept hashed in Redis, effective within a second in every API process.

    stepwise keys create --tenant team-a [--admin]   # prints the new key (only now) on stdout
    stepwise keys list [--json]                      # id, tenant, scope, created, the key's first characters
                                                     # (--json: one JSON array)
    stepwise keys revoke KEY_OR_ID                   # by the key itself or its id

It talks to Redis, not to the API (an operator's tool, like `celery inspect`): `--redis-url`, else
STEPWISE_REDIS_URL, else the Redis of a `stepwise up` running from this folder (storage.redis_location). Keys in
STEPWISE_API_KEYS and STEPWISE_ADMIN_API_KEYS keep working beside these; they are not listed.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import redis

from settings import read, read_if_set
from stepwise_cli.client import default_var_dir
from storage.api_keys import ApiKeyStore
from storage.errors import StorageUnavailableError
from storage.job_store import JobStore
from storage.redis_location import find_redis


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--redis-url", help="Redis of the service (default: $STEPWISE_REDIS_URL, else `up`'s)")
    parser.add_argument("--var-dir", type=Path, help="where `stepwise up` saved its Redis URL (default ./var)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a key for a tenant and print it")
    create.add_argument("--tenant", required=True, help="the tenant the key acts for")
    create.add_argument("--admin", action="store_true", help="an operator's key: also /metrics and /v1/admin")
    listing = actions.add_parser("list", help="list the keys kept in Redis")
    listing.add_argument("--json", action="store_true", help="a JSON array, one object per key")
    revoke = actions.add_parser("revoke", help="revoke a key, given by itself or by its id")
    revoke.add_argument("key_or_id", metavar="KEY_OR_ID")


def redis_url(args: argparse.Namespace) -> str:
    """--redis-url, else the Redis every stepwise process finds (storage.redis_location); a Sentinel URL with the
    master STEPWISE_REDIS_SENTINEL_MASTER names."""
    configured = args.redis_url or read_if_set("STEPWISE_REDIS_URL")
    master = read_if_set("STEPWISE_REDIS_SENTINEL_MASTER")
    return find_redis(configured, args.var_dir or default_var_dir(), master).url


def created(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def run(args: argparse.Namespace) -> int:
    job_store = JobStore(redis_url(args), replica_wait_seconds=read("STEPWISE_REDIS_REPLICA_WAIT"))
    store = ApiKeyStore(job_store.redis, job_store.keys, job_store.replica_wait)  # kept once a replica has it
    try:
        if args.action == "create":
            key, record = store.create(args.tenant, "admin" if args.admin else "tenant")
            print(key)
            sys.stderr.write(
                f"created {record.key_id} for tenant {record.tenant} ({record.scope}); the key is shown only now\n"
            )
        elif args.action == "list":
            records = sorted(store.all().values(), key=lambda r: r.created_at)
            if args.json:
                print(json.dumps([{**r.__dict__, "created_at": created(r.created_at)} for r in records], indent=2))
            else:
                for record in records:
                    print(
                        f"{record.key_id}  {record.tenant:<20}  {record.scope:<6}  {created(record.created_at)}  "
                        f"{record.shown}..."
                    )
        else:
            revoked = store.revoke(args.key_or_id)
            if revoked is None:
                sys.stderr.write("stepwise keys: no such key (give the key itself or its id from `keys list`)\n")
                return 1
            sys.stderr.write(f"revoked {revoked.key_id} of tenant {revoked.tenant}\n")
    except ValueError as e:
        sys.stderr.write(f"stepwise keys: {e}\n")
        return 2
    except (redis.RedisError, StorageUnavailableError) as e:
        sys.stderr.write(f"stepwise keys: cannot reach Redis: {e}\n")
        return 1
    finally:
        job_store.close()
    return 0
