"""A producer's lost sends are counted and fail it (exit 3), never pass in silence."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaTimeoutError, NotEnoughReplicasError
from kafka.future import Future

from streaming.deliveries import Deliveries
from streaming.errors import KafkaUnavailable


def test_every_failed_send_is_counted_and_fails_the_check() -> None:
    deliveries = Deliveries()
    futures = [Future() for _ in range(5)]
    for future in futures:
        deliveries.watch(future)
    futures[0].success("metadata")
    futures[1].failure(NotEnoughReplicasError("2 of 3 in sync needed"))
    futures[2].success("metadata")
    futures[3].failure(KafkaTimeoutError("delivery.timeout.ms"))
    futures[4].success("metadata")
    with pytest.raises(KafkaUnavailable, match="did not take 2 of 5 records") as raised:
        deliveries.check()
    assert "NotEnoughReplicasError" in str(raised.value)  # the first error is named
    assert raised.value.exit_code == 3


def test_all_delivered_passes_the_check() -> None:
    deliveries = Deliveries()
    for _ in range(3):
        future = Future()
        deliveries.watch(future)
        future.success("metadata")
    deliveries.check()
    assert (deliveries.sent, deliveries.lost) == (3, 0)
