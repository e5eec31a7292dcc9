"""levelzero's operating errors as Kafka error codes: one mapping for every API."""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from levelzero.core.errors import LevelZeroError

ERROR_BY_CODE: dict[str, ErrorCode] = {
    "unknown_topic": ErrorCode.unknown_topic_or_partition,
    "unknown_partition": ErrorCode.unknown_topic_or_partition,
    "offset_out_of_range": ErrorCode.offset_out_of_range,
    "corrupt_message": ErrorCode.corrupt_message,
    "unsupported_compression": ErrorCode.unsupported_compression_type,
    "not_leader": ErrorCode.not_leader_or_follower,
    "stale_cluster_epoch": ErrorCode.not_leader_or_follower,  # retriable; the batcher retried
    "shutting_down": ErrorCode.not_leader_or_follower,
    "storage_error": ErrorCode.kafka_storage_error,
    "store_refused": ErrorCode.kafka_storage_error,
    "topic_exists": ErrorCode.topic_already_exists,
    "topic_collides": ErrorCode.invalid_topic_exception,
    "internal_topic": ErrorCode.invalid_request,  # as Kafka's controller answers for its own
    "invalid_config": ErrorCode.invalid_config,
    "policy_violation": ErrorCode.policy_violation,
    "invalid_input": ErrorCode.invalid_request,
    "too_large": ErrorCode.message_too_large,
    "invalid_record": ErrorCode.invalid_record,
    "corrupt_data": ErrorCode.kafka_storage_error,
    "object_not_found": ErrorCode.kafka_storage_error,
    "out_of_order_sequence": ErrorCode.out_of_order_sequence_number,
    "invalid_producer_epoch": ErrorCode.invalid_producer_epoch,
}


def error_code_for(exc: BaseException) -> ErrorCode:
    if isinstance(exc, LevelZeroError):
        return ERROR_BY_CODE.get(exc.code, ErrorCode.unknown_server_error)
    return ErrorCode.unknown_server_error


def coordinator_unavailable(what: str, exc: LevelZeroError) -> ErrorCode:
    """A group or transaction coordinator's store failed `what` (a request, its group or id):
    said once in the log, answered COORDINATOR_NOT_AVAILABLE (the client finds the coordinator
    again and retries)."""
    logging.getLogger("levelzero.kafka").warning("%s: %s: %s", what, exc.code, exc)
    return ErrorCode.coordinator_not_available
