"""One object store (bucket + key prefix) belongs to one levelzero cluster.

The GC deletes every L0 object at or below its own `M`; a second cluster writing into the same
keyspace would have its objects deleted by the first one's GC (and vice versa). So each data
directory carries a cluster id, the store carries a marker with the id of the cluster that owns
it, and a daemon whose id does not match refuses to start with a message saying what to do.
"""

from __future__ import annotations

import logging
import os
import uuid

from levelzero.core.errors import ObjectNotFound, StoreRefused
from levelzero.storage.protocols import ObjectStore

log = logging.getLogger("levelzero.daemon")

MARKER_KEY = "levelzero/cluster-id"  # outside level_zero/ and level_one/: never the GC's
CLUSTER_ID_FILE = "cluster-id"


class StoreOwnedByAnotherCluster(StoreRefused):
    code = "store_owned_by_another_cluster"


def local_cluster_id(data_dir: str) -> str:
    """This data directory's cluster id, created (atomically) on first start."""
    path = os.path.join(data_dir, CLUSTER_ID_FILE)
    try:
        with open(path, encoding="ascii") as f:
            return f.read().strip()
    except FileNotFoundError:
        pass
    cluster_id = uuid.uuid4().hex
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(cluster_id + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return cluster_id


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


async def claim_store(store: ObjectStore, cluster_id: str, where: str) -> None:
    """Write the marker if the store has none; refuse a store owned by another cluster."""
    owner = await store_owner(store)
    if owner is None:
        await store.put(MARKER_KEY, (cluster_id + "\n").encode())
        owner = (await store.get(MARKER_KEY)).decode("ascii", "replace").strip()  # a racing claim
        log.info("claimed object store %s for cluster %s", where, cluster_id)
    refuse_another_owner(owner, cluster_id, where)
