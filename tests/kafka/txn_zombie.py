"""A transactional producer run as a child process by test_kafka_txn_zombie: it opens a
transaction, writes `zombie-0..4` (flushed: stored), prints `produced` and waits for a line on
stdin (the test SIGSTOPs it meanwhile, past its transaction timeout). Then it writes `zombie-late`
and tries to commit; prints `committed`, or `error NAME fatal|abortable|retriable`."""

from __future__ import annotations

import sys

from confluent_kafka import KafkaException, Producer

TIMEOUT_MS = 3_000


def main(port: int, topic: str, tid: str) -> int:
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{port}",
            "transactional.id": tid,
            "transaction.timeout.ms": TIMEOUT_MS,
            "linger.ms": 2,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=b"zombie-%d" % i, partition=0)
    assert producer.flush(30) == 0
    print("produced", flush=True)
    sys.stdin.readline()
    try:
        producer.produce(topic, value=b"zombie-late", partition=0)
        producer.flush(30)
        producer.commit_transaction(30)
    except KafkaException as exc:
        error = exc.args[0]
        kind = "fatal" if error.fatal() else "abortable" if error.txn_requires_abort() else "retriable"
        print(f"error {error.name()} {kind}", flush=True)
        return 0
    print("committed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
