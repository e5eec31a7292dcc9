"""A full disk under the SQLite log store: the store's refusal says what to do, and the systemd
unit keeps restarting the daemon until there is room (docs/operating.md, "Storage health")."""

from __future__ import annotations

import configparser
import sqlite3
from pathlib import Path

import pytest

from levelzero.storage.sqlite.store import failed_batch_message

UNIT = Path(__file__).resolve().parents[2] / "levelzero" / "deploy" / "levelzero.service"


def _sqlite_full_error(tmp_path: Path) -> sqlite3.OperationalError:
    """SQLite's own SQLITE_FULL error (a database capped at its page count fills as a disk does)."""
    connection = sqlite3.connect(tmp_path / "capped.db")
    try:
        connection.execute("CREATE TABLE t (v BLOB)")
        connection.commit()
        connection.execute("PRAGMA max_page_count = 3")
        with pytest.raises(sqlite3.OperationalError) as caught:
            connection.execute("INSERT INTO t VALUES (zeroblob(65536))")  # more than 3 pages
        return caught.value
    finally:
        connection.close()


def test_a_full_disk_is_named_with_its_directory_and_what_to_do(tmp_path: Path) -> None:
    error = _sqlite_full_error(tmp_path)
    # The writer process answers with the error's text; the store's own connection raises it.
    for seen in (
        error,
        RuntimeError(f"the writer process could not commit a batch: OperationalError: {error}"),
    ):
        message = failed_batch_message(str(tmp_path / "levelzero.db"), seen)
        assert message.startswith(f"{tmp_path / 'levelzero.db'}: a write batch failed and was rolled back")
        assert f"The file system of {tmp_path} is full (" in message
        assert " bytes free): free space there" in message
        assert "systemd restarts it" in message and "nothing acknowledged is lost" in message


def test_another_failure_says_only_that_the_store_refuses_writes(tmp_path: Path) -> None:
    message = failed_batch_message(str(tmp_path / "levelzero.db"), sqlite3.OperationalError("disk I/O error"))
    assert message.endswith("the log store refuses writes until the daemon restarts")
    assert "is full" not in message


def test_the_unit_restarts_the_daemon_without_giving_up() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read(UNIT)
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # systemd's default gives up after 5 in 10 s
    assert unit["Service"]["Restart"] == "on-failure"
    assert float(unit["Service"]["RestartSec"]) >= 1  # not a busy loop while the disk stays full
