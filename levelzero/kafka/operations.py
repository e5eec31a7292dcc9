"""The authorized operations Kafka's describe answers carry (KIP-430): levelzero has no ACLs (a
client that authenticated may do everything), so, as a Kafka broker without an authorizer
answers, every operation Kafka supports on the resource (`AclEntry.supportedOperations`), as a
bit field of AclOperation codes; Int.MinValue when the request did not ask."""

from __future__ import annotations

NOT_ASKED = -2147483648  # Kafka's schema default: not asked for

# Kafka's AclOperation codes
_READ, _WRITE, _CREATE, _DELETE, _ALTER, _DESCRIBE = 3, 4, 5, 6, 7, 8
_CLUSTER_ACTION, _DESCRIBE_CONFIGS, _ALTER_CONFIGS, _IDEMPOTENT_WRITE = 9, 10, 11, 12

SUPPORTED: dict[str, tuple[int, ...]] = {
    "topic": (_READ, _WRITE, _CREATE, _DESCRIBE, _DELETE, _ALTER, _DESCRIBE_CONFIGS, _ALTER_CONFIGS),
    "group": (_READ, _DESCRIBE, _DELETE, _DESCRIBE_CONFIGS, _ALTER_CONFIGS),
    "cluster": (
        _CREATE,
        _CLUSTER_ACTION,
        _DESCRIBE_CONFIGS,
        _ALTER_CONFIGS,
        _IDEMPOTENT_WRITE,
        _ALTER,
        _DESCRIBE,
    ),
}


def authorized_operations(resource: str, asked: bool = True) -> int:
    """The bit field a describe answer carries for `resource` ("topic", "group", "cluster")."""
    if not asked:
        return NOT_ASKED
    return sum(1 << code for code in SUPPORTED[resource])
