"""A consume-transform-produce application (exactly-once, Kafka's transactional pattern) run as
a child process by test_kafka_eos_kill: it reads the input topic read_committed from its group's
committed offsets, and for each poll writes one output record per input record and commits the
inputs' offsets inside the same transaction (`send_offsets_to_transaction`). On any error it
exits (status 3): the test starts a new incarnation with the same transactional.id, whose
init_transactions fences the old one and completes or aborts its transaction, and which
resumes from the committed offsets. Prints `committed N` after each commit (N transactions)."""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

# librdkafka >= 2.10 re-bootstraps when every broker is down (the daemon killed): it
# decommissions the broker handle, and a group-coordinator request of send_offsets_to_transaction
# queued on the old handle then waits forever (past its timeout). Without re-bootstrap the client
# reconnects to the same address, as a client of a one-broker cluster should.
CLIENT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "metadata.recovery.strategy": "none"}
RUN_MAX_S = 180.0  # bounded: the test ends it well before
POLL_MAX = 20  # input records a transaction


def main(port: int, source: str, sink: str, partitions: int, tid: str) -> int:
    bootstrap = f"127.0.0.1:{port}"
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": tid,
            "transaction.timeout.ms": 20_000,
            "linger.ms": 2,
            **CLIENT,
        }
    )
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "eos-app",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **CLIENT,
        }
    )
    try:
        # First: a previous incarnation's transaction is completed or aborted before the
        # committed offsets are read.
        producer.init_transactions(30)
        consumer.assign([TopicPartition(source, p) for p in range(partitions)])
        metadata = consumer.consumer_group_metadata()
        transactions = 0
        deadline = time.monotonic() + RUN_MAX_S
        while time.monotonic() < deadline:
            messages = consumer.consume(num_messages=POLL_MAX, timeout=0.2)
            if not messages:
                continue
            producer.begin_transaction()
            for message in messages:
                if message.error() is not None:
                    raise KafkaException(message.error())
                producer.produce(sink, value=b"out-" + message.value(), partition=message.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), metadata, 30)
            producer.commit_transaction(30)
            transactions += 1
            print(f"committed {transactions}", flush=True)
    except KafkaException as exc:
        print(f"error: {exc}", flush=True)
        return 3
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]))
