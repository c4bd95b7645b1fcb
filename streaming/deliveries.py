"""What a producer sent and Kafka did not take: kafka-python's ``send`` only queues a
record, and a record its retries and ``delivery.timeout.ms`` could not place fails its
future and nothing else. Every send of ours is watched here, and a producer that lost any
says how many, instead of exiting 0 with events missing."""

from __future__ import annotations

import threading

from kafka.future import Future

from streaming.errors import KafkaUnavailable


class Deliveries:
    """Watches send futures; ``check`` after a flush raises if any failed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.sent = 0
        self.lost = 0
        self.first_error: BaseException | None = None

    def watch(self, future: Future) -> None:
        self.sent += 1
        future.add_errback(self._failed)

    def _failed(self, error: BaseException) -> None:
        with self._lock:
            self.lost += 1
            self.first_error = self.first_error or error

    def check(self) -> None:
        """Raise ``KafkaUnavailable`` (exit 3) naming the count if any send failed; call it
        after the producer's flush, when every future has its outcome."""
        if self.lost:
            raise KafkaUnavailable(
                f"Kafka did not take {self.lost} of {self.sent} records after the producer's "
                f"retries (first error: {self.first_error!r}); the rest were delivered. "
                "Check the brokers (kafka.bootstrap_servers) and send the lost ones again"
            )
