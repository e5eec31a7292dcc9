"""docs/kafka.md's table of consumer group limits states the bounds the coordinator enforces."""

from __future__ import annotations

from pathlib import Path

from levelzero.kafka import groups

DOC = Path(__file__).resolve().parents[2] / "docs" / "kafka.md"


def _limits_table() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Consumer group limits", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[1].strip(): cells[2].strip() for cells in rows[1:]}


def test_the_documented_group_limits_are_the_coordinator_s() -> None:
    table = _limits_table()
    assert table["group id length"] == f"1-{groups.GROUP_ID_CHARS_MAX} characters"
    assert table["groups a node coordinates"].startswith(f"{groups.GROUPS_MAX:,} ")
    assert table["members of one group"] == f"{groups.MEMBERS_PER_GROUP_MAX:,}"
    assert table["session timeout"] == (
        f"{groups.SESSION_TIMEOUT_S_MIN * 1000:.0f} ms to {groups.SESSION_TIMEOUT_S_MAX:.0f} s"
    )
    assert table["rebalance timeout"].startswith(f"at most {groups.REBALANCE_TIMEOUT_S_MAX:.0f} s")
    assert table["offset commit metadata"] == f"{groups.METADATA_CHARS_MAX:,} characters"
