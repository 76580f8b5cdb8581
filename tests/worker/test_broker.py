"""The worker's broker transport survives what Celery does when Redis goes away (worker/broker.py).

`tests/faults/test_redis_restart.py` shows it with a real Redis restart, where the timing decides
whether Celery hits the problem; this test puts the channel in that state on purpose.
"""

from __future__ import annotations

from kombu import Connection, Exchange, Queue

from worker.broker import TRANSPORT


def test_a_channel_whose_transport_was_detached_closes_and_acknowledges_quietly(redis_url):
    queue = Queue("broker-test", Exchange("broker-test"), routing_key="broker-test")
    with Connection(redis_url, transport=TRANSPORT) as connection:
        channel = connection.default_channel
        connection.Producer(channel).publish(
            {"job": 1}, exchange=queue.exchange, routing_key="broker-test", declare=[queue]
        )
        message = queue(channel).get(no_ack=False)  # delivered, not yet acknowledged
        assert message is not None

        # What Celery 5.7's consumer leaves behind on a lost connection: the channel's pools are
        # gone and the transport is detached from its connection (Connection.collect()).
        channel._disconnect_pools()
        connection.transport.client = None

        channel.close()  # with kombu's own transport: AttributeError, and the consumer stops for good
        message.ack()  # the task's thread acknowledges it later: the same AttributeError

        assert channel.closed
