"""A cluster node takes its lease when it registers and must renew it within the TTL, so nothing
slow may run between its registration and serving: every module the daemon serves with (the
Kafka handlers, the HTTP server's protocol) is imported before it registers. Imports under load
took 9-17 s, longer than a lease, and the node found itself forgotten by the control plane.

Checked in a fresh interpreter (in this one, other tests imported everything long ago): every
module of levelzero or a third-party package present when the node is ready was present when it
registered with PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from daemon_support import clean_environ

PROBE = """
import json, sys, anyio
from levelzero.storage.postgres.store import PostgresLogStore
from levelzero.daemon.service import running_daemon
from daemon_support import daemon_config, free_port, postgres_overrides

at_registration = []
register_node = PostgresLogStore.register_node

async def registering(self, *args, **kwargs):
    if not at_registration:
        at_registration.append(set(sys.modules))
    return await register_node(self, *args, **kwargs)

PostgresLogStore.register_node = registering

async def main(dsn, data_dir):
    port = free_port()
    config = daemon_config(
        data_dir, **postgres_overrides(dsn), server__listen=f"127.0.0.1:{port}",
        cluster__enabled=True, cluster__node_id="n", cluster__advertise_url=f"http://127.0.0.1:{port}",
        kafka__listen="127.0.0.1:0", metrics__listen="127.0.0.1:0",
    )
    async with running_daemon(config):
        late = set(sys.modules) - at_registration[0]
        # A standard-library codec a first host-name lookup loads (encodings.idna) is not
        # what this is about: levelzero's modules and third-party packages are.
        print(json.dumps(sorted(m for m in late if m.split(".")[0] not in sys.stdlib_module_names)))

anyio.run(main, sys.argv[1], sys.argv[2])
"""


def test_no_module_is_imported_between_registration_and_ready(tmp_path: Path, postgres_dsn: str) -> None:
    tests_dir = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, postgres_dsn, str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tests_dir,
        env=clean_environ(PYTHONPATH=str(tests_dir)),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    imported_late = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported_late == [], " ".join(imported_late)
