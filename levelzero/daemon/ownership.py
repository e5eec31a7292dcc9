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

from levelzero.core.errors import ObjectNotFound, StoreRefused
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


def refuse_lost_cluster_id(
    data_dir: str, database: str, store_where: str, local_objects_dir: str | None
) -> None:
    """At start-up, before the control plane is opened: a data directory whose SQLite control
    plane (`levelzero.db`) is there but whose `cluster-id` is not lost its id (a removal, a
    partial copy). Refused, naming the id the object store's marker holds where it can be read
    here (a local store), with nothing changed: a new id, made as on a first start, would be
    refused by the store's marker as "another cluster's" only after the database had been
    migrated and the new id written."""
    path = os.path.join(data_dir, CLUSTER_ID_FILE)
    if os.path.exists(path) or not os.path.exists(database):
        return
    owner = None
    if local_objects_dir is not None:
        marker = os.path.join(local_objects_dir, MARKER_KEY)
        with contextlib.suppress(OSError, UnicodeDecodeError), open(marker, encoding="ascii") as f:
            owner = f.read(4096).strip() or None
    if owner is not None and _CLUSTER_ID_RE.match(owner):
        advice = (
            f"the object store's marker ({MARKER_KEY} in {store_where}) names cluster {owner}: "
            f"if this directory is that cluster's, `echo {owner} > {path}` and start again"
        )
    else:
        advice = (
            f"the object store's marker ({MARKER_KEY} in {store_where}) names the cluster that "
            f"owns it: if this directory is that cluster's, write its id to {path} and start again"
        )
    raise StoreRefused(
        f"data directory {data_dir} holds a control plane ({os.path.basename(database)}) but no "
        f"{CLUSTER_ID_FILE} file (removed, or not copied with it); nothing was changed. {advice}"
    )


async def store_owner(store: ObjectStore) -> str | None:
    """The cluster id the store's marker names, or None if no cluster has claimed it."""
    try:
        return (await store.get(MARKER_KEY)).decode("ascii", "replace").strip()
    except ObjectNotFound:
        return None


def refuse_another_owner(
    owner: str, cluster_id: str, where: str, *, ours: str = "this data directory"
) -> None:
    """The one check of a cluster id against the store's owner (`ours` says what names it)."""
    if owner != cluster_id:
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
) -> None:
    """Write the marker if the store has none; refuse a store owned by another cluster.
    `named_object`: an L1 object the control plane names (None: it names none), looked for
    when the store is empty and unclaimed: such a store is not this data directory's (a wrong
    mount, bucket or key prefix), and claiming it would serve every read of those objects with
    an error, reported healthy."""
    owner = await store_owner(store)
    if owner is None:
        if named_object is not None and not (await store.list_page("", limit=1)).objects:
            key = await named_object()
            if key is not None:
                raise StoreRefused(
                    f"object store {where} is empty and no cluster's, but this data "
                    f"directory's control plane names objects in it ({key}, ...): is the "
                    "storage configured as it was (storage.objects_path, s3.bucket, "
                    "s3.key_prefix, s3.endpoint)? Nothing was written. If its objects are lost "
                    f"for good, and their records with them, start anyway by writing the marker "
                    f"first: {cluster_id} into {MARKER_KEY} in the store"
                )
        await store.put(MARKER_KEY, (cluster_id + "\n").encode())
        owner = (await store.get(MARKER_KEY)).decode("ascii", "replace").strip()  # a racing claim
        log.info("claimed object store %s for cluster %s", where, cluster_id)
    refuse_another_owner(owner, cluster_id, where)
