"""One object store (bucket + key prefix) belongs to one levelzero cluster.

The GC deletes every L0 object at or below its own `M`; a second cluster writing into the same
keyspace would have its objects deleted by the first one's GC (and vice versa). So each data
directory carries a cluster id, the store carries a marker with the id of the cluster that owns
it, and a daemon whose id does not match refuses to start with a message saying what to do.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import uuid
from collections.abc import Awaitable, Callable

import anyio

from levelzero.core.errors import LevelZeroError, ObjectNotFound, StoreRefused
from levelzero.storage.protocols import ObjectStore

log = logging.getLogger("levelzero.daemon")

MARKER_KEY = "levelzero/cluster-id"  # outside level_zero/ and level_one/: never the GC's
CLUSTER_ID_FILE = "cluster-id"


class StoreOwnedByAnotherCluster(StoreRefused):
    code = "store_owned_by_another_cluster"


# What `local_cluster_id` writes (a random UUID's hex digits), and so what it reads back.
_CLUSTER_ID_RE = re.compile(r"[0-9a-f]{32}\Z", re.ASCII)


def local_cluster_id(data_dir: str) -> str:
    """This data directory's cluster id, created (atomically) on first start. A file holding
    anything else than an id is refused, not taken for one (the store's marker would then
    name "another cluster", and the advice for that is not the right one)."""
    path = os.path.join(data_dir, CLUSTER_ID_FILE)
    try:
        with open(path, "rb") as f:
            text = f.read(4096).decode("ascii", "replace").strip()
    except FileNotFoundError:
        pass
    else:
        if _CLUSTER_ID_RE.match(text) is None:
            raise StoreRefused(
                f"{path} holds {text[:80]!r}, not a cluster id (32 hex digits, as levelzero "
                f"writes it): write the id of the cluster that owns this directory's object "
                f"store there (its marker, {MARKER_KEY} in the store, names it)"
            )
        return text
    cluster_id = uuid.uuid4().hex
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(cluster_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return cluster_id


def prepare_cluster_id(data_dir: str, database: str, store_where: str, local_objects_dir: str | None) -> bool:
    """At start-up, before the SQLite control plane (`database`) is opened: this data
    directory's cluster id, made now on a first start (so that a first start failing later, a
    store unreachable, leaves the id beside the database it made). A directory whose database
    is there but whose `cluster-id` is not lost its id (a removal, a partial copy): refused when
    the store's marker can be read here (a local store) and names a cluster, with its id and
    nothing changed; with no marker the store was never claimed (a first start that failed
    before its claim, by an earlier release): a new id. True: the id is lost and the store (S3)
    is not read yet: `refuse_lost_id` decides once it is, before any id is made."""
    path = os.path.join(data_dir, CLUSTER_ID_FILE)
    if os.path.exists(path) or not os.path.exists(database):
        local_cluster_id(data_dir)  # read (checked), or made on a first start
        return False
    if local_objects_dir is None:
        return True
    owner = None
    marker = os.path.join(local_objects_dir, MARKER_KEY)
    with contextlib.suppress(OSError, UnicodeDecodeError), open(marker, encoding="ascii") as f:
        owner = f.read(4096).strip() or None
    if owner is not None:
        raise _lost_id(data_dir, database, owner, store_where, "Nothing was changed in the data directory")
    local_cluster_id(data_dir)
    return False


def _lost_id(data_dir: str, database: str, owner: str, store_where: str, changed: str) -> StoreRefused:
    path = os.path.join(data_dir, CLUSTER_ID_FILE)
    if _CLUSTER_ID_RE.match(owner):
        advice = f"if this directory is that cluster's, `echo {owner} > {path}` and start again"
    else:
        advice = f"if this directory is that cluster's, write its id to {path} and start again"
    return StoreRefused(
        f"data directory {data_dir} holds a control plane ({os.path.basename(database)}) but no "
        f"{CLUSTER_ID_FILE} file (removed, or not copied with it), and the object store's marker "
        f"({MARKER_KEY} in {store_where}) names cluster {owner[:80]}: {advice}. {changed}"
    )


async def refuse_lost_id(store: ObjectStore, data_dir: str, database: str, store_where: str) -> None:
    """`prepare_cluster_id`'s refusal for a store read only now (S3): before any id is made,
    but after the control plane was opened (and its schema brought up to this release's)."""
    owner = await store_owner(store)
    if owner is not None:
        changed = "No cluster id was made (the database may have been brought to this release's schema)"
        raise _lost_id(data_dir, database, owner, store_where, changed)


async def store_owner(store: ObjectStore) -> str | None:
    """The cluster id the store's marker names, or None if no cluster has claimed it."""
    try:
        return (await store.get(MARKER_KEY)).decode("ascii", "replace").strip()
    except ObjectNotFound:
        return None


async def _write_marker(store: ObjectStore, cluster_id: str) -> str:
    """Write the marker naming `cluster_id`, then read it back: the owner it names then (another
    cluster's where a claim raced this one). ObjectNotFound if it is gone again already."""
    await store.put(MARKER_KEY, (cluster_id + "\n").encode())
    return (await store.get(MARKER_KEY)).decode("ascii", "replace").strip()


def refuse_another_owner(
    owner: str, cluster_id: str, where: str, *, ours: str = "this data directory", empty: bool = False
) -> None:
    """The one check of a cluster id against the store's owner (`ours` says what names it;
    `empty`: its control plane holds no partition, as one made anew in place of a lost one)."""
    if owner == cluster_id:
        return
    if empty:
        raise StoreOwnedByAnotherCluster(
            f"object store {where} belongs to levelzero cluster {owner}, but {ours} is cluster "
            f"{cluster_id} and its control plane holds no topic: if it replaces a control plane "
            "that was lost, rebuild it from the bucket with `levelzero recover --from-bucket` "
            "(this configuration, every daemon stopped), which takes the bucket's cluster id; "
            "if the store is another cluster's, give this daemon its own bucket or s3.key_prefix"
        )
    raise StoreOwnedByAnotherCluster(
        f"object store {where} belongs to levelzero cluster {owner}, but {ours} "
        f"is cluster {cluster_id}: its GC would delete the other cluster's objects. Give each "
        "daemon its own bucket or its own s3.key_prefix (or restore the data directory that "
        "owns the store)"
    )


async def claim_store(
    store: ObjectStore,
    cluster_id: str,
    where: str,
    named_object: Callable[[], Awaitable[str | None]] | None = None,
    *,
    ours: str = "this data directory",
    control_plane_empty: Callable[[], Awaitable[bool]] | None = None,
) -> None:
    """Write the marker if the store has none; refuse a store owned by another cluster.
    `named_object`: an L1 object the control plane names (None: it names none), looked for
    when the store is unclaimed. Missing, the store is not this data directory's (a wrong
    mount, bucket or key prefix) or it lost its objects (a bucket emptied), and claiming it
    would serve every read of those objects with an error, reported healthy. Whether the
    store is empty does not say: a store emptied while a daemon ran holds what it wrote
    since (its health probe, new L0 objects). Present, the marker alone was lost (or an
    earlier release never wrote one): the claim is made again, with a warning. `ours` names
    what holds `cluster_id` in a refusal; `control_plane_empty` says whether the control plane
    holds no partition (its advice is then the rebuild from the bucket)."""
    owner = await store_owner(store)
    if owner is None:
        key = None if named_object is None else await named_object()
        if key is not None and await store.head(key) is None:
            raise StoreRefused(
                f"object store {where} is no cluster's and does not hold {key}, an object this "
                "data directory's control plane names: is the storage configured as it was "
                "(storage.objects_path, s3.bucket, s3.key_prefix, s3.endpoint), or were its "
                "objects deleted? Nothing was written. If its objects are lost for good, and "
                f"their records with them, start anyway by writing the marker first: "
                f"{cluster_id} into {MARKER_KEY} in the store"
            )
        owner = await _write_marker(store, cluster_id)
        if key is None:
            log.info("claimed object store %s for cluster %s", where, cluster_id)
        else:
            log.warning(
                "claimed object store %s for cluster %s again: it had no marker (%s), though it "
                "holds the objects this data directory's control plane names (the marker "
                "deleted, or a store an earlier release never marked)",
                where,
                cluster_id,
                MARKER_KEY,
            )
    if owner != cluster_id:  # (`control_plane_empty`: the refusal's advice, asked only then)
        empty = control_plane_empty is not None and await control_plane_empty()
        refuse_another_owner(owner, cluster_id, where, ours=ours, empty=empty)


MARKER_CHECK_INTERVAL_S = 60.0
FOREIGN_MARKER = "foreign_marker"  # the reason of the GC's pause while another cluster's marker holds


class MarkerWatch:
    """The store's marker read again while the daemon runs (every MARKER_CHECK_INTERVAL_S).

    - Gone (a bucket emptied, the keyspace deleted): said once at ERROR (records acknowledged
      before may be lost), and written again at once: this node writes into the keyspace, so it
      is this cluster's, and another cluster started on it meanwhile would claim it and have
      its objects deleted by this GC (or this cluster's by its GC).
    - Another cluster's: two clusters share the keyspace. This node's GC is paused (it would
      delete the other's objects) and its writes refused (the other's GC would delete them),
      until the marker is this cluster's again; said once at ERROR.

    `lost` counts the markers found gone, `owned` is whether the marker is this cluster's. A
    failed read changes nothing (the storage's health reports the store)."""

    def __init__(
        self,
        store: ObjectStore,
        cluster_id: str,
        where: str,
        *,
        pause_gc: Callable[[], None],
        resume_gc: Callable[[], None],
        refuse_writes: Callable[[str | None], None],
    ) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._where = where
        self._pause_gc = pause_gc
        self._resume_gc = resume_gc
        self._refuse_writes = refuse_writes
        self.owner: str | None = cluster_id  # the marker's cluster as last read (None: none)
        self.lost = 0

    @property
    def owned(self) -> bool:
        return self.owner == self._cluster_id

    async def check(self) -> None:
        try:
            owner = await store_owner(self._store)
            if owner is None:
                self.lost += 1
                log.error(
                    "the object store %s lost its marker %s: it was emptied or its keyspace "
                    "deleted (records acknowledged before may be lost; reads of them fail "
                    "object_not_found): find out what deleted it. The marker is written again",
                    self._where,
                    MARKER_KEY,
                )
                owner = await _write_marker(self._store, self._cluster_id)
        except LevelZeroError:
            return
        if owner == self.owner:
            return
        was_ours, self.owner = self.owned, owner
        if was_ours:
            self._pause_gc()
            self._refuse_writes(
                f"the object store {self._where} is claimed by levelzero cluster {owner}, not this "
                f"cluster {self._cluster_id}: writes are refused and the GC paused until its "
                f"marker {MARKER_KEY} names this cluster again"
            )
            log.error(
                "the object store %s is now claimed by levelzero cluster %s, not this cluster %s: "
                "two clusters share its keyspace; this node's GC is paused and its writes refused "
                "(each cluster's GC would delete the other's objects). Give each cluster its own "
                "bucket or s3.key_prefix",
                self._where,
                owner,
                self._cluster_id,
            )
        elif self.owned:
            self._refuse_writes(None)
            self._resume_gc()
            log.info("the object store %s is this cluster's again (marker %s)", self._where, MARKER_KEY)

    async def run(self, interval_s: float = MARKER_CHECK_INTERVAL_S) -> None:
        while True:
            await anyio.sleep(interval_s)
            await self.check()
