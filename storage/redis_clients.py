"""Redis clients made from STEPWISE_REDIS_URL, the same way in every process: one server (`redis://`,
`rediss://`, `unix://`), or the master that Redis Sentinel names (`sentinel://`, `sentinels://` over TLS:
settings.sentinel_url).

With Sentinel, every new connection asks the sentinels where the master is (redis-py's `Sentinel.master_for`),
so a client follows a failover by itself: a command on a connection to the old master fails (refused, or
READONLY once it was demoted: redis-py turns that into a ConnectionError), the pool's retry policy and the
caller's (a 503 in the API, `worker.outage_retry` on a worker) try again, and the next connection reaches the
new master. Scripts are not replicated in Redis 7, so the new master answers NOSCRIPT once: redis-py's
`Script` and `storage.new_job.run_creates` load the script and run it again.

`celery_redis_config` gives Celery the same Redis: kombu's Sentinel transport and result backend, the master
named in their options (`master_name`), TLS in `broker_use_ssl`.
"""

from __future__ import annotations

import ssl
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelConnectionPool
from redis.sentinel import Sentinel, SentinelConnectionPool

from settings.sentinel_url import SentinelUrl, is_sentinel_url

SENTINEL_TIMEOUT = 1.0  # seconds per sentinel asked: one that is down must not hold up finding the master
CERT_REQS = {"required": ssl.CERT_REQUIRED, "optional": ssl.CERT_OPTIONAL, "none": ssl.CERT_NONE}


class BlockingSentinelConnectionPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """Sentinel's pool (connections to whichever server is the master now) that, like redis-py's blocking
    pool, makes a caller wait for a free connection instead of failing when all are in use."""


class AsyncBlockingSentinelConnectionPool(AsyncSentinelConnectionPool, aioredis.BlockingConnectionPool):
    """The same for asyncio clients."""


def sentinel_url(url: str) -> SentinelUrl | None:
    """The URL's Sentinel parts, or None for a URL that names one server."""
    return SentinelUrl.parse("STEPWISE_REDIS_URL", url) if is_sentinel_url(url) else None


def describe_redis(url: str) -> str:
    """Where a client of `url` connects, for error messages: `host:port`, or the master and its sentinels."""
    sentinel = sentinel_url(url)
    if sentinel is not None:
        return sentinel.describe()
    kwargs = redis.connection.parse_url(url)
    return kwargs.get("path") or f"{kwargs.get('host', '127.0.0.1')}:{kwargs.get('port', 6379)}"


def _sentinel_kwargs(sentinel: SentinelUrl) -> dict[str, Any]:
    """How the sentinels themselves are reached: short timeouts, their password, TLS as the master's."""
    kwargs: dict[str, Any] = {"socket_timeout": SENTINEL_TIMEOUT, "socket_connect_timeout": SENTINEL_TIMEOUT}
    if sentinel.sentinel_password:
        kwargs["password"] = sentinel.sentinel_password
    if sentinel.is_tls:
        kwargs.update(ssl=True, **sentinel.tls)
    return kwargs


def _master_kwargs(sentinel: SentinelUrl) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"db": sentinel.db}
    if sentinel.username:
        kwargs["username"] = sentinel.username
    if sentinel.password:
        kwargs["password"] = sentinel.password
    if sentinel.is_tls:
        kwargs.update(ssl=True, **sentinel.tls)
    return kwargs


def _pool_options(max_connections: int | None, pool_timeout: float | None) -> dict[str, Any]:
    """redis-py's pool options for a bound on connections and a wait for a free one (either may be unset)."""
    options: dict[str, Any] = {}
    if max_connections is not None:
        options["max_connections"] = max_connections
    if pool_timeout is not None:
        options["timeout"] = pool_timeout
    return options


def open_redis(url: str, *, max_connections: int | None = None, pool_timeout: float | None = None, **connection: Any):
    """A client of `url`. `connection`: redis-py's connection options (decode_responses, socket_timeout, retry...).
    With `pool_timeout`, a blocking pool of `max_connections`: a caller waits up to that long for a free one."""
    sentinel = sentinel_url(url)
    pool_options = _pool_options(max_connections, pool_timeout)
    if sentinel is None:
        pool_class = redis.BlockingConnectionPool if pool_timeout is not None else redis.ConnectionPool
        return redis.Redis.from_pool(pool_class.from_url(url, **pool_options, **connection))
    manager = Sentinel(list(sentinel.sentinels), sentinel_kwargs=_sentinel_kwargs(sentinel))
    return manager.master_for(
        sentinel.master_name,
        connection_pool_class=BlockingSentinelConnectionPool if pool_timeout is not None else SentinelConnectionPool,
        **pool_options,
        **_master_kwargs(sentinel),
        **connection,
    )


def open_async_redis(
    url: str, *, max_connections: int | None = None, pool_timeout: float | None = None, **connection: Any
) -> aioredis.Redis:
    """`open_redis` for asyncio."""
    sentinel = sentinel_url(url)
    pool_options = _pool_options(max_connections, pool_timeout)
    if sentinel is None:
        pool_class = aioredis.BlockingConnectionPool if pool_timeout is not None else aioredis.ConnectionPool
        return aioredis.Redis.from_pool(pool_class.from_url(url, **pool_options, **connection))
    manager = AsyncSentinel(list(sentinel.sentinels), sentinel_kwargs=_sentinel_kwargs(sentinel))
    is_blocking = pool_timeout is not None
    return manager.master_for(
        sentinel.master_name,
        connection_pool_class=AsyncBlockingSentinelConnectionPool if is_blocking else AsyncSentinelConnectionPool,
        **pool_options,
        **_master_kwargs(sentinel),
        **connection,
    )


def close_redis(client: redis.Redis) -> None:
    """Close the client, its pool, and its connections to the sentinels (if any)."""
    pool = client.connection_pool
    client.close()
    pool.disconnect()
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        manager.close()


async def aclose_redis(client: aioredis.Redis) -> None:
    """`close_redis` for asyncio."""
    pool = client.connection_pool
    await client.aclose()
    await pool.disconnect()
    manager = getattr(pool, "sentinel_manager", None)
    if manager is not None:
        await manager.aclose()


def celery_redis_config(
    url: str, broker_transport_options: dict[str, Any], result_backend_transport_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Celery settings for this Redis as broker and result backend, with the caller's transport options (merge
    into `app.conf`). A one-server URL is given as it is; a Sentinel URL in Celery's form, with the master's
    name, the sentinels' password and TLS where kombu and Celery's result backend read them."""
    config: dict[str, Any] = {
        "broker_url": url,
        "result_backend": url,
        "broker_transport_options": dict(broker_transport_options),
        "result_backend_transport_options": dict(result_backend_transport_options or {}),
    }
    sentinel = sentinel_url(url)
    if sentinel is None:
        return config
    options = {"master_name": sentinel.master_name, "sentinel_kwargs": _sentinel_kwargs(sentinel)}
    config["broker_url"] = config["result_backend"] = sentinel.celery_url()
    config["broker_transport_options"].update(options)
    config["result_backend_transport_options"].update(options)
    if sentinel.is_tls:
        tls = {**sentinel.tls, "ssl_cert_reqs": CERT_REQS[sentinel.tls["ssl_cert_reqs"]]}
        config.update(broker_use_ssl=tls, redis_backend_use_ssl=dict(tls))
    return config
