"""The Redis broker transport the worker uses: kombu's (its Sentinel one for a `sentinel://` URL), with one fix
for reconnecting.

When the connection to Redis drops, Celery's consumer (5.7) first detaches the connection's
transport (`collect()`) and then closes the connection. Closing its channel tries to put the
channel's unacknowledged messages back in the queue through the detached transport, and so does
acknowledging, later, a message that channel delivered. Both raise `AttributeError` instead of a
connection error, and the consumer then stops for good instead of reconnecting. Here both finish
quietly. Those messages stay in Redis' unacked set, so they come back after the visibility
timeout and do nothing then (their jobs have ended); their jobs keep running on this worker, and
a job whose worker dies is re-queued through its lease (`worker.leases`).
"""

from __future__ import annotations

import logging

from kombu.transport import TRANSPORT_ALIASES, redis

from settings.sentinel_url import is_sentinel_url

log = logging.getLogger(__name__)


class Channel(redis.Channel):
    def basic_ack(self, delivery_tag, multiple: bool = False) -> None:
        if self.closed:  # delivered before the connection was lost: see the module docstring
            log.info("message %s left unacknowledged: its broker connection was lost", delivery_tag)
            return
        super().basic_ack(delivery_tag, multiple=multiple)

    def basic_reject(self, delivery_tag, requeue: bool = False) -> None:
        if self.closed:
            log.info("message %s left unrejected: its broker connection was lost", delivery_tag)
            return
        super().basic_reject(delivery_tag, requeue=requeue)

    def close(self) -> None:
        try:
            super().close()
        except AttributeError as e:  # the transport was detached: see the module docstring
            log.info("broker channel closed after its connection was lost (%s)", e)


class Transport(redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, redis.SentinelChannel):  # the same fix, on kombu's Sentinel channel
    pass


class SentinelTransport(redis.SentinelTransport):
    Channel = SentinelChannel


TRANSPORT = f"{__name__}:Transport"
SENTINEL_TRANSPORT = f"{__name__}:SentinelTransport"


def transport_for(redis_url: str) -> str:
    """Celery's `broker_transport` for STEPWISE_REDIS_URL: the Sentinel one for a `sentinel://` URL.

    For Sentinel, the `sentinel://` scheme is also made to name it in this process: when a connection fails,
    kombu switches to the URL's next `sentinel://` part and takes the transport from its scheme again, which
    would drop `broker_transport` and with it the fix above after the first failover."""
    if not is_sentinel_url(redis_url):
        return TRANSPORT
    TRANSPORT_ALIASES["sentinel"] = SENTINEL_TRANSPORT  # before any connection resolved it (kombu caches that)
    return SENTINEL_TRANSPORT
