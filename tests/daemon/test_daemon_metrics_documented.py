"""Every metric family a running daemon exports is documented in docs/operating.md's metrics
tables (name, type, labels, meaning), and every family documented there is exported or says
when it is absent: the list the operator reads is the list the daemon serves."""

from __future__ import annotations

import re
from pathlib import Path

from daemon_support import scrape_of_a_working_daemon
from prometheus_client.parser import text_string_to_metric_families

OPERATING = Path(__file__).resolve().parents[2] / "docs" / "operating.md"
ROW = re.compile(r"^\| `([a-z0-9_]+)` \| (counter|gauge|histogram) \| ?([^|\n]*?) ?\| (.+) \|$", re.MULTILINE)
# A documented family the scrape may lack says when: "Absent ..." or "Only ...".
CONDITIONAL = re.compile(r"\b(Absent|Only)\b")


class Documented:
    def __init__(self, text: str) -> None:
        section = text[text.index("### Metrics\n") : text.index("### Dashboard and alerts\n")]
        self.rows = {name: (kind, labels, meaning) for name, kind, labels, meaning in ROW.findall(section)}

    def labels_of(self, name: str) -> set[str]:
        cell = re.sub(r"\([^)]*\)", "", self.rows[name][1])  # `(value, ...)`: a label's values
        return set(re.findall(r"`([a-z_]+)`", cell))


def exported(text: str) -> dict[str, tuple[str, set[str], str]]:
    """Each family as its series are named (counters with `_total`): type, labels, HELP."""
    families = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        families[name] = (family.type, labels, family.documentation)
    return families


def test_the_tables_are_read() -> None:
    documented = Documented(OPERATING.read_text())
    assert len(documented.rows) >= 130
    assert documented.rows["levelzero_partition_mp"][0] == "gauge"
    assert documented.labels_of("levelzero_storage_healthy") == {"store"}
    assert documented.labels_of("levelzero_object_store_errors_total") == {"operation", "error"}


async def test_every_exported_metric_is_documented_and_every_documented_one_exported(
    tmp_path: Path,
) -> None:
    families = exported(await scrape_of_a_working_daemon(tmp_path))
    documented = Documented(OPERATING.read_text())
    assert sorted(set(families) - set(documented.rows)) == []
    wrong_type = {
        name: (kind, documented.rows[name][0])
        for name, (kind, _, _) in families.items()
        if documented.rows[name][0] != kind
    }
    assert wrong_type == {}
    undocumented_labels = {
        name: sorted(labels - documented.labels_of(name))
        for name, (_, labels, _) in families.items()
        if labels - documented.labels_of(name)
    }
    assert undocumented_labels == {}
    unexplained_absence = sorted(
        name
        for name, (_, _, meaning) in documented.rows.items()
        if name not in families and not CONDITIONAL.search(meaning)
    )
    assert unexplained_absence == []


async def test_help_texts_are_sentences_not_field_names(tmp_path: Path) -> None:
    """The log store's counters said "Log store (control plane) rejected_appends."."""
    families = exported(await scrape_of_a_working_daemon(tmp_path))
    placeholders = {
        name: help_text
        for name, (_, _, help_text) in families.items()
        if name.startswith("levelzero_")  # the others are prometheus_client's
        and (re.search(r"\b[a-z0-9]+_[a-z0-9_]+\.?$", help_text) or not help_text[:1].isalnum())
    }
    assert placeholders == {}
