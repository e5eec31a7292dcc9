"""Per-topic configs: Kafka's topic configs, which of them levelzero enforces, how a request
changes a topic's set, and what a topic's effective settings are. Pure: the control plane keeps
each topic's set (name -> value, as text), the node and the front ends ask here.

Every topic config of Kafka 3.x (LogConfig: name, type, default, the broker config it falls
back to) is known, in one of four kinds:

- ENFORCED: `retention.ms`, `retention.bytes` (the housekeeper), `max.message.bytes` (the produce
  intake) and `cleanup.policy` (`delete` applies retention; `compact` runs the compactor,
  `actors/compactor.py`; `COMPACTION_ENABLED` is the switch that accepts it).
- COMPACTION: the compaction settings: `min.compaction.lag.ms`, `delete.retention.ms`,
  `min.cleanable.dirty.ratio` and `max.compaction.lag.ms` (dirty data older than it is
  compacted whatever the dirty ratio) govern the compactor of a compacted topic
  (`TopicPolicy`). They govern nothing for a topic whose policy is `delete`, as in Kafka.
- NOT_APPLICABLE: settings of a Kafka broker's local log files and replicas (`segment.bytes`,
  `flush.ms`, ...): levelzero has no such files or replicas, so every valid value behaves
  alike. Stored and reported.
- DEFAULT_ONLY: a behaviour levelzero does not have (`compression.type` other than `producer`,
  `LogAppendTime`, timestamp bounds): the default is accepted, any other value is refused.

A config that is unknown, malformed or not enforced is refused with `InvalidConfig` (Kafka's
INVALID_CONFIG), never stored and silently ignored. A topic's unset configs take the broker's
value (`BrokerConfigs`: what the node is configured with) or Kafka's default, and DescribeConfigs
reports where each value comes from (Kafka's config sources and synonyms).
"""

from __future__ import annotations

import math
import re

import enum
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from .errors import InvalidConfig

# The switch compaction flipped: with it, `cleanup.policy=compact` is accepted.
COMPACTION_ENABLED = True

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_JAVA_INTEGER = re.compile(r"[+-]?[0-9]+")  # what Long.parseLong takes
INT64_MIN = -(2**63)
CONFIG_VALUE_CHARS_MAX = 4096  # a stored value (Kafka bounds none; a control-plane row should be)
CONFIGS_PER_REQUEST_MAX = 1000


class Kind(enum.Enum):
    ENFORCED = "enforced"
    COMPACTION = "compaction"
    NOT_APPLICABLE = "not_applicable"
    DEFAULT_ONLY = "default_only"


class ConfigType(enum.IntEnum):
    """Kafka's DescribeConfigs config types (v3+)."""

    BOOLEAN = 1
    STRING = 2
    INT = 3
    LONG = 5
    DOUBLE = 6
    LIST = 7


class ConfigSource(enum.IntEnum):
    """Kafka's DescribeConfigs config sources (v1+)."""

    DYNAMIC_TOPIC_CONFIG = 1
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


class AlterOp(enum.IntEnum):
    """IncrementalAlterConfigs' operations."""

    SET = 0
    DELETE = 1
    APPEND = 2
    SUBTRACT = 3


@dataclass(frozen=True, slots=True)
class TopicConfigDef:
    name: str
    type: ConfigType
    default: str  # Kafka's default, spelled as DescribeConfigs shows it
    # the broker configs an unset topic config falls back to, the first set one winning (Kafka's
    # ServerTopicConfigSynonyms, in its order; none for a topic-level-only config)
    broker_names: tuple[str, ...]
    kind: Kind
    at_least: float | None = None  # numbers: the smallest valid value
    at_most: float | None = None
    choices: tuple[str, ...] = ()  # strings and lists: the valid values


_LONG_MAX = str(INT64_MAX)
_E = Kind.ENFORCED
_C = Kind.COMPACTION
_N = Kind.NOT_APPLICABLE
_D = Kind.DEFAULT_ONLY
_T = ConfigType

TOPIC_CONFIGS: dict[str, TopicConfigDef] = {
    d.name: d
    for d in (
        TopicConfigDef(
            "cleanup.policy", _T.LIST, "delete", ("log.cleanup.policy",), _E, choices=("compact", "delete")
        ),
        TopicConfigDef(
            "compression.type",
            _T.STRING,
            "producer",
            ("compression.type",),
            _D,
            choices=("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"),
        ),
        # KIP-390 (Kafka 3.8): a producer's or broker's recompression level; levelzero stores
        # records as the producer sent them (compression.type=producer), so these are stored only
        TopicConfigDef("compression.gzip.level", _T.INT, "-1", ("compression.gzip.level",), _N),
        TopicConfigDef("compression.lz4.level", _T.INT, "9", ("compression.lz4.level",), _N, 1, 17),
        TopicConfigDef("compression.zstd.level", _T.INT, "3", ("compression.zstd.level",), _N, -131072, 22),
        TopicConfigDef(
            "delete.retention.ms", _T.LONG, "86400000", ("log.cleaner.delete.retention.ms",), _C, 0
        ),
        TopicConfigDef("file.delete.delay.ms", _T.LONG, "60000", ("log.segment.delete.delay.ms",), _N, 0),
        TopicConfigDef("flush.messages", _T.LONG, _LONG_MAX, ("log.flush.interval.messages",), _N, 1),
        TopicConfigDef(
            "flush.ms",
            _T.LONG,
            _LONG_MAX,
            ("log.flush.interval.ms", "log.flush.scheduler.interval.ms"),
            _N,
            0,
        ),
        TopicConfigDef(
            "follower.replication.throttled.replicas",
            _T.LIST,
            "",
            (),
            _N,
        ),
        TopicConfigDef("index.interval.bytes", _T.INT, "4096", ("log.index.interval.bytes",), _N, 0),
        TopicConfigDef("leader.replication.throttled.replicas", _T.LIST, "", (), _N),
        TopicConfigDef("local.retention.bytes", _T.LONG, "-2", ("log.local.retention.bytes",), _N, -2),
        TopicConfigDef("local.retention.ms", _T.LONG, "-2", ("log.local.retention.ms",), _N, -2),
        TopicConfigDef(
            "max.compaction.lag.ms", _T.LONG, _LONG_MAX, ("log.cleaner.max.compaction.lag.ms",), _C, 1
        ),
        TopicConfigDef("max.message.bytes", _T.INT, "1048588", ("message.max.bytes",), _E, 0),
        TopicConfigDef(
            "message.downconversion.enable", _T.BOOLEAN, "true", ("log.message.downconversion.enable",), _N
        ),
        TopicConfigDef("message.format.version", _T.STRING, "3.0-IV1", ("log.message.format.version",), _N),
        TopicConfigDef(
            "message.timestamp.after.max.ms",
            _T.LONG,
            _LONG_MAX,
            ("log.message.timestamp.after.max.ms",),
            _D,
            0,
        ),
        TopicConfigDef(
            "message.timestamp.before.max.ms",
            _T.LONG,
            _LONG_MAX,
            ("log.message.timestamp.before.max.ms",),
            _D,
            0,
        ),
        TopicConfigDef(
            "message.timestamp.difference.max.ms",
            _T.LONG,
            _LONG_MAX,
            ("log.message.timestamp.difference.max.ms",),
            _D,
            0,
        ),
        TopicConfigDef(
            "message.timestamp.type",
            _T.STRING,
            "CreateTime",
            ("log.message.timestamp.type",),
            _D,
            choices=("CreateTime", "LogAppendTime"),
        ),
        TopicConfigDef(
            "min.cleanable.dirty.ratio", _T.DOUBLE, "0.5", ("log.cleaner.min.cleanable.ratio",), _C, 0, 1
        ),
        TopicConfigDef("min.compaction.lag.ms", _T.LONG, "0", ("log.cleaner.min.compaction.lag.ms",), _C, 0),
        TopicConfigDef("min.insync.replicas", _T.INT, "1", ("min.insync.replicas",), _N, 1),
        TopicConfigDef("preallocate", _T.BOOLEAN, "false", ("log.preallocate",), _N),
        # topic-level only, no broker synonym (Kafka's LogConfig.CONFIGS_WITH_NO_SERVER_DEFAULTS;
        # the remote.log.* pair is KIP-950, Kafka 3.9)
        TopicConfigDef("remote.log.copy.disable", _T.BOOLEAN, "false", (), _N),
        TopicConfigDef("remote.log.delete.on.disable", _T.BOOLEAN, "false", (), _N),
        TopicConfigDef("remote.storage.enable", _T.BOOLEAN, "false", (), _N),
        TopicConfigDef("retention.bytes", _T.LONG, "-1", ("log.retention.bytes",), _E),
        TopicConfigDef(
            "retention.ms",
            _T.LONG,
            "604800000",
            ("log.retention.ms", "log.retention.minutes", "log.retention.hours"),
            _E,
            -1,
        ),
        TopicConfigDef("segment.bytes", _T.INT, "1073741824", ("log.segment.bytes",), _N, 14),
        TopicConfigDef("segment.index.bytes", _T.INT, "10485760", ("log.index.size.max.bytes",), _N, 4),
        TopicConfigDef(
            "segment.jitter.ms", _T.LONG, "0", ("log.roll.jitter.ms", "log.roll.jitter.hours"), _N, 0
        ),
        TopicConfigDef("segment.ms", _T.LONG, "604800000", ("log.roll.ms", "log.roll.hours"), _N, 1),
        TopicConfigDef(
            "unclean.leader.election.enable", _T.BOOLEAN, "false", ("unclean.leader.election.enable",), _N
        ),
    )
}


@dataclass(frozen=True, slots=True)
class BrokerConfigs:
    """What a node is configured with, as Kafka's broker configs. They are read-only: levelzero
    takes them from its configuration file at start-up."""

    broker_id: int
    retention_ms: int = -1  # housekeeper.retention_s; -1: kept forever
    retention_bytes: int = -1  # housekeeper.retention_bytes; -1: no size limit
    message_max_bytes: int = 4 * 1024 * 1024  # batcher.batch_bytes_max
    num_partitions: int = 1  # kafka.default_partitions
    auto_create_topics: bool = False  # kafka.auto_create_topics
    advertised_listeners: str = ""  # PROTOCOL://HOST:PORT of the Kafka listener clients are told

    def values(self) -> dict[str, str]:
        """The broker configs levelzero sets, by Kafka's names (see `source`)."""
        listeners = {"advertised.listeners": self.advertised_listeners} if self.advertised_listeners else {}
        return {
            **listeners,
            "auto.create.topics.enable": "true" if self.auto_create_topics else "false",
            "broker.id": str(self.broker_id),
            "compression.type": "producer",
            "default.replication.factor": "1",
            "log.cleanup.policy": "delete",
            "log.message.timestamp.type": "CreateTime",
            "log.retention.bytes": str(self.retention_bytes),
            "log.retention.ms": str(self.retention_ms),
            "message.max.bytes": str(self.message_max_bytes),
            "min.insync.replicas": "1",
            "num.partitions": str(self.num_partitions),
        }


# Kafka's own defaults of the broker configs that are topic configs' synonyms but not the topic
# config's default spelled alike: time in other units, and configs without a default (None:
# Kafka's broker has no value for them unless set, so DescribeConfigs lists no such synonym).
_SYNONYM_DEFAULTS: dict[str, str | None] = {
    "log.flush.interval.ms": None,
    "log.flush.scheduler.interval.ms": _LONG_MAX,
    "log.retention.ms": None,
    "log.retention.minutes": None,
    "log.retention.hours": "168",
    "log.roll.ms": None,
    "log.roll.hours": "168",
    "log.roll.jitter.ms": None,
    "log.roll.jitter.hours": "0",
}

# Kafka's own defaults of its broker configs (those with one): the topic configs' synonyms, and
# the broker configs levelzero sets. A broker config levelzero leaves at such a value is
# reported as DEFAULT_CONFIG (as a Kafka broker whose server.properties does not set it), any
# other as STATIC_BROKER_CONFIG.
KAFKA_BROKER_DEFAULTS: dict[str, str] = {
    **{d.broker_names[0]: d.default for d in TOPIC_CONFIGS.values() if len(d.broker_names) == 1},
    **{name: value for name, value in _SYNONYM_DEFAULTS.items() if value is not None},
    "auto.create.topics.enable": "true",
    "broker.id": "-1",
    "default.replication.factor": "1",
    "num.partitions": "1",
}


def broker_source(name: str, value: str) -> ConfigSource:
    """Where a broker config's value comes from, as Kafka reports it."""
    if KAFKA_BROKER_DEFAULTS.get(name) == value:
        return ConfigSource.DEFAULT_CONFIG
    return ConfigSource.STATIC_BROKER_CONFIG


_BROKER_TYPES: dict[str, ConfigType] = {
    "advertised.listeners": ConfigType.LIST,
    "auto.create.topics.enable": ConfigType.BOOLEAN,
    "broker.id": ConfigType.INT,
    "default.replication.factor": ConfigType.INT,
    "message.max.bytes": ConfigType.INT,
    "min.insync.replicas": ConfigType.INT,
    "num.partitions": ConfigType.INT,
}


# ---------------------------------------------------------------------- validation


def _parse(d: TopicConfigDef, value: str) -> str:
    """`value` as stored (normalised), or InvalidConfig naming the problem as Kafka does."""
    text = value.strip()
    problem = f"Invalid value {value} for configuration {d.name}"
    if d.type in (ConfigType.INT, ConfigType.LONG, ConfigType.DOUBLE):
        try:
            # As Java's parsers: ASCII digits only (Python's int() takes "5_0" and other
            # scripts' digits), and a finite double (NaN passes every range check)
            if d.type is not ConfigType.DOUBLE and not _JAVA_INTEGER.fullmatch(text):
                raise ValueError(text)
            number: float = float(text) if d.type is ConfigType.DOUBLE else int(text)
            # (an int is finite; isfinite would convert it to a float, which overflows past
            # ~1e308: a 400-digit value was a 500)
            if d.type is ConfigType.DOUBLE and not math.isfinite(number):
                raise ValueError(text)
        except ValueError:
            kind = {ConfigType.INT: "int", ConfigType.LONG: "long", ConfigType.DOUBLE: "double"}[d.type]
            raise InvalidConfig(f"{problem}: Not a number of type {kind.upper()}") from None
        low, high = (-(2**31), INT32_MAX) if d.type is ConfigType.INT else (INT64_MIN, INT64_MAX)
        if d.type is not ConfigType.DOUBLE and not low <= number <= high:
            raise InvalidConfig(f"{problem}: Not a number of type {d.type.name}")
        if d.at_least is not None and number < d.at_least:
            raise InvalidConfig(f"{problem}: Value must be at least {_shown(d.at_least)}")
        if d.at_most is not None and number > d.at_most:
            raise InvalidConfig(f"{problem}: Value must be no more than {_shown(d.at_most)}")
        return str(number)
    if d.type is ConfigType.BOOLEAN:
        if text.lower() not in ("true", "false"):
            raise InvalidConfig(f"{problem}: Expected value to be either true or false")
        return text.lower()
    if d.type is ConfigType.LIST:
        items = [item.strip() for item in text.split(",")] if text else []
        if any(not item for item in items):
            raise InvalidConfig(f"{problem}: an empty list item")
        if d.choices:
            for item in items:
                if item not in d.choices:
                    raise InvalidConfig(f"{problem}: String must be one of: {', '.join(d.choices)}")
        return ",".join(dict.fromkeys(items))
    if d.choices and text not in d.choices:
        raise InvalidConfig(f"{problem}: String must be one of: {', '.join(d.choices)}")
    return text


# Kafka's ThrottledReplicaListValidator: "*" or partition:broker pairs
_THROTTLED = re.compile(r"\*|[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*")
# Kafka 3.9's MetadataVersion: each release and its inter-broker versions ("IV"s); a version is
# named by its release ("2.8") or release and IV ("2.8-IV1").
_RELEASE_IVS = {
    "0.8.0": 0, "0.8.1": 0, "0.8.2": 0, "0.9.0": 0, "0.10.0": 2, "0.10.1": 3, "0.10.2": 1,
    "0.11.0": 3, "1.0": 1, "1.1": 1, "2.0": 2, "2.1": 3, "2.2": 2, "2.3": 2, "2.4": 2, "2.5": 1,
    "2.6": 1, "2.7": 3, "2.8": 2, "3.0": 2, "3.1": 1, "3.2": 1, "3.3": 4, "3.4": 1, "3.5": 3,
    "3.6": 3, "3.7": 5, "3.8": 1, "3.9": 1,
}  # fmt: skip
METADATA_VERSIONS = frozenset(_RELEASE_IVS) | {
    f"{release}-IV{n}" for release, ivs in _RELEASE_IVS.items() for n in range(ivs)
}


def metadata_version_known(text: str) -> bool:
    """Kafka's `MetadataVersion.fromVersionString`, which message.format.version's validator
    calls: the first three dot-separated parts of a version beginning "0." and the first two of
    any other name it (anything after them is ignored: "1.0.1" is 1.0), else the whole text."""
    parts = text.split(".")
    kept = 3 if text.startswith("0.") else 2
    key = text if len(parts) <= kept else ".".join(parts[:kept])
    return key in METADATA_VERSIONS


def _check_value(name: str, value: str, parsed: str) -> None:
    """What Kafka's per-config validators refuse beyond type and range."""
    problem = f"Invalid value {value} for configuration {name}"
    if name.endswith(".replication.throttled.replicas") and parsed and not _THROTTLED.fullmatch(parsed):
        raise InvalidConfig(
            f"{problem}: must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],..."
        )
    if name == "message.format.version" and not metadata_version_known(parsed):
        raise InvalidConfig(f"{problem}: Version `{parsed}` is not a valid version")
    if name == "compression.gzip.level" and not (parsed == "-1" or 1 <= int(parsed) <= 9):
        raise InvalidConfig(f"{problem}: Value must be between 1 and 9, or -1")
    if name == "remote.storage.enable" and parsed == "true":
        raise InvalidConfig(
            "Tiered Storage functionality is disabled in the broker. Topic cannot be configured "
            "with remote log storage (levelzero's log is in object storage already)"
        )


def check_set(configs: Mapping[str, str]) -> None:
    """What Kafka's LogConfig.validateValues refuses of a topic's whole set (the values given
    and the defaults of those not given): a minimum compaction lag above the maximum."""
    low = int(configs.get("min.compaction.lag.ms", TOPIC_CONFIGS["min.compaction.lag.ms"].default))
    high = int(configs.get("max.compaction.lag.ms", TOPIC_CONFIGS["max.compaction.lag.ms"].default))
    if low > high:
        raise InvalidConfig(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > max.compaction.lag.ms ({high})"
        )


def _shown(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


def check_config(name: str, value: str | None, broker: BrokerConfigs) -> str:
    """`value` for topic config `name`, normalised, if levelzero takes it; else InvalidConfig."""
    d = TOPIC_CONFIGS.get(name)
    if d is None:
        raise InvalidConfig(f"Unknown topic config name: {name}")
    if value is None:
        raise InvalidConfig(f"Null value not supported for topic configs: {name}")
    if len(value) > CONFIG_VALUE_CHARS_MAX:
        raise InvalidConfig(f"the value of {name} is over {CONFIG_VALUE_CHARS_MAX} characters")
    parsed = _parse(d, value)
    _check_value(name, value, parsed)
    if d.kind is Kind.DEFAULT_ONLY and parsed != d.default:
        raise InvalidConfig(
            f"{name}={value} is not supported by levelzero (it does not enforce it): only {d.default!r}"
        )
    if name == "cleanup.policy" and "compact" in parsed.split(",") and not COMPACTION_ENABLED:
        raise InvalidConfig(
            "cleanup.policy=compact is not supported: levelzero does not compact topics yet, and a "
            "topic that is not compacted must not claim to be"
        )
    if name == "max.message.bytes" and int(parsed) > broker.message_max_bytes:
        raise InvalidConfig(
            f"max.message.bytes {parsed} is above the node's limit message.max.bytes "
            f"{broker.message_max_bytes} (batcher.batch_bytes_max), which it could not store"
        )
    return parsed


def check_configs(configs: Iterable[tuple[str, str | None]], broker: BrokerConfigs) -> dict[str, str]:
    """A set of topic configs (CreateTopics, AlterConfigs), each checked; a name given twice is
    refused (Kafka: INVALID_REQUEST for a duplicate, but INVALID_CONFIG for what follows)."""
    out: dict[str, str] = {}
    for count, (name, value) in enumerate(configs, 1):
        if count > CONFIGS_PER_REQUEST_MAX:
            raise InvalidConfig(f"at most {CONFIGS_PER_REQUEST_MAX} configs in one request")
        if name in out:
            raise InvalidConfig(f"topic config {name} is given twice")
        out[name] = check_config(name, value, broker)
    check_set(out)
    return out


def altered(
    current: Mapping[str, str], ops: Sequence[tuple[AlterOp, str, str | None]], broker: BrokerConfigs
) -> dict[str, str]:
    """A topic's set after IncrementalAlterConfigs' `ops` (each checked): SET and DELETE any
    config, APPEND and SUBTRACT items of a list config (on its current value, else its
    default, as Kafka does)."""
    out = dict(current)
    seen: set[str] = set()
    for op, name, value in ops:
        d = TOPIC_CONFIGS.get(name)
        if d is None:
            raise InvalidConfig(f"Unknown topic config name: {name}")
        if name in seen:
            raise InvalidConfig(f"topic config {name} is altered twice in one request")
        seen.add(name)
        if op is AlterOp.DELETE:
            out.pop(name, None)
            continue
        if value is None:
            raise InvalidConfig(f"Null value not supported for topic configs: {name}")
        if op is AlterOp.SET:
            out[name] = check_config(name, value, broker)
            continue
        if d.type is not ConfigType.LIST:
            verb = "append" if op is AlterOp.APPEND else "subtract"
            raise InvalidConfig(f"Config value {verb} is not allowed for config key: {name}")
        items = [i for i in out.get(name, d.default).split(",") if i]
        given = [i for i in _parse(d, value).split(",") if i]
        if op is AlterOp.APPEND:
            items += [i for i in given if i not in items]
        else:
            items = [i for i in items if i not in given]
        out[name] = check_config(name, ",".join(items), broker)
    check_set(out)
    return out


# ---------------------------------------------------------------------- effective settings


@dataclass(frozen=True, slots=True)
class TopicPolicy:
    """What levelzero enforces for one topic."""

    retention_ms: int | None  # None: records are kept whatever their age
    retention_bytes: int | None  # None: whatever the partition's size
    max_message_bytes: int  # one produce's records, by the one size rule
    # cleanup.policy has `compact`: the compactor keeps the latest record per key, and a
    # record without a key is refused (Kafka's INVALID_RECORD)
    compacted: bool = False
    min_compaction_lag_ms: int = 0
    delete_retention_ms: int = 86_400_000
    min_cleanable_dirty_ratio: float = 0.5
    # dirty data older than this is compacted whatever the dirty ratio (None: Kafka's default,
    # Long.MAX_VALUE, no bound)
    max_compaction_lag_ms: int | None = None
    # cleanup.policy has `delete`: retention applies, and DeleteRecords may move the start
    # offset (Kafka refuses it otherwise: POLICY_VIOLATION)
    deletes: bool = True


def topic_policy(stored: Mapping[str, str], broker: BrokerConfigs) -> TopicPolicy:
    policy = stored.get("cleanup.policy", "delete").split(",")
    retention_ms = int(stored.get("retention.ms", broker.retention_ms))
    retention_bytes = int(stored.get("retention.bytes", broker.retention_bytes))
    deletes = "delete" in policy
    max_lag = int(stored.get("max.compaction.lag.ms", _LONG_MAX))
    return TopicPolicy(
        retention_ms if deletes and retention_ms >= 0 else None,
        retention_bytes if deletes and retention_bytes >= 0 else None,
        min(int(stored.get("max.message.bytes", broker.message_max_bytes)), broker.message_max_bytes),
        compacted="compact" in policy,
        deletes=deletes,
        min_compaction_lag_ms=int(stored.get("min.compaction.lag.ms", "0")),
        delete_retention_ms=int(stored.get("delete.retention.ms", "86400000")),
        min_cleanable_dirty_ratio=float(stored.get("min.cleanable.dirty.ratio", "0.5")),
        max_compaction_lag_ms=None if max_lag >= int(_LONG_MAX) else max_lag,
    )


# ---------------------------------------------------------------------- DescribeConfigs


@dataclass(frozen=True, slots=True)
class Synonym:
    name: str
    value: str
    source: ConfigSource


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str
    source: ConfigSource
    read_only: bool
    type: ConfigType
    synonyms: tuple[Synonym, ...]  # highest precedence first; the entry's own source first

    @property
    def is_default(self) -> bool:
        return self.source is ConfigSource.DEFAULT_CONFIG


def _broker_synonyms(names: Sequence[str], broker: BrokerConfigs) -> list[Synonym]:
    """What Kafka's ConfigHelper lists for the broker configs `names` (synonyms of one config,
    highest precedence first): those the node sets, then Kafka's defaults, each in `names`'
    order; leading ones other than the first-named are dropped, as Kafka does (a broker that sets
    only `log.retention.hours` lists no synonym for `retention.ms`)."""
    values = broker.values()
    static = [
        Synonym(n, values[n], ConfigSource.STATIC_BROKER_CONFIG)
        for n in names
        if n in values and broker_source(n, values[n]) is ConfigSource.STATIC_BROKER_CONFIG
    ]
    defaults = [
        Synonym(n, KAFKA_BROKER_DEFAULTS[n], ConfigSource.DEFAULT_CONFIG)
        for n in names
        if n in KAFKA_BROKER_DEFAULTS
    ]
    out = static + defaults
    while out and out[0].name != names[0]:
        out.pop(0)
    return out


def _broker_group(name: str) -> tuple[str, ...]:
    """The broker configs `name` is the first of (Kafka's DynamicBrokerConfig.brokerConfigSynonyms:
    `log.retention.ms`, `.minutes`, `.hours`), else `name` alone."""
    for d in TOPIC_CONFIGS.values():
        if d.broker_names[:1] == (name,):
            return d.broker_names
    return (name,)


def describe_topic(
    stored: Mapping[str, str], broker: BrokerConfigs, names: Iterable[str] | None = None
) -> list[ConfigEntry]:
    """A topic's configs as DescribeConfigs shows them (`names`: only those; unknown names are
    left out, as Kafka does), in name order."""
    wanted = sorted(TOPIC_CONFIGS) if names is None else sorted(set(names) & set(TOPIC_CONFIGS))
    out = []
    for name in wanted:
        d = TOPIC_CONFIGS[name]
        synonyms = _broker_synonyms(d.broker_names, broker) if d.broker_names else []
        if name in stored:
            synonyms.insert(0, Synonym(name, stored[name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
        # the first synonym is the topic's or a first-named broker config, in the topic config's
        # unit; with none (`segment.ms`, whose Kafka default is `log.roll.hours`, dropped) the
        # value is Kafka's default
        top = synonyms[0] if synonyms else Synonym(name, d.default, ConfigSource.DEFAULT_CONFIG)
        out.append(ConfigEntry(name, top.value, top.source, False, d.type, tuple(synonyms)))
    return out


def describe_broker(broker: BrokerConfigs, names: Iterable[str] | None = None) -> list[ConfigEntry]:
    """The node's broker configs (read-only), in name order."""
    values = broker.values()
    wanted = sorted(values) if names is None else sorted(set(names) & set(values))
    out = []
    for name in wanted:
        synonyms = _broker_synonyms(_broker_group(name), broker)
        source = synonyms[0].source if synonyms else ConfigSource.DEFAULT_CONFIG
        kind = _BROKER_TYPES.get(
            name, ConfigType.LONG if name.startswith("log.retention") else ConfigType.STRING
        )
        if name == "log.cleanup.policy":
            kind = ConfigType.LIST
        out.append(ConfigEntry(name, values[name], source, True, kind, tuple(synonyms)))
    return out


# ---------------------------------------------------------------------- retention


@dataclass(frozen=True, slots=True)
class RetainedObject:
    """One valid L1 object of a partition, as retention sees it."""

    last_offset: int
    size: int
    created_at: float  # wall seconds


def retention_start_offset(
    objects: Sequence[RetainedObject],
    start_offset: int,
    now: float,
    retention_s: float | None,
    retention_bytes: int | None,
) -> int:
    """The partition's start offset after retention, as Kafka moves its log start offset over
    whole segments (here: whole L1 objects, oldest first; data not yet reconciled is never
    removed, as Kafka never removes its active segment):

    - by time, the oldest objects for as long as each is older than `retention_s`;
    - by size, the oldest objects for as long as the objects left still hold at least
      `retention_bytes` (Kafka's `size - segment.size >= retention.bytes`).

    `objects` are in offset order; those wholly below `start_offset` are already gone."""
    live = [o for o in objects if o.last_offset >= start_offset]
    new_start = start_offset
    if retention_s is not None:
        for o in live:
            if now - o.created_at <= retention_s:
                break
            new_start = max(new_start, o.last_offset + 1)
    if retention_bytes is not None:
        remaining = sum(o.size for o in live)
        for o in live:
            if remaining - o.size < retention_bytes:
                break
            remaining -= o.size
            new_start = max(new_start, o.last_offset + 1)
    assert new_start >= start_offset
    return new_start
