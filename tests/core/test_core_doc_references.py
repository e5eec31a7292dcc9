"""Messages that send the operator to the documentation name a file and section that exist:
`docs/X.md, 'Section'` (the sections moved out of the README into docs/; a message still
pointing at "the README, '...'" sent the operator to a section that is no longer there)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = re.compile(r"(docs/[\w-]+\.md)(?:, '([^']+)')?")


def _strings() -> list[tuple[str, str, bool]]:
    """(where, text, is_docstring) of every string literal under levelzero/."""
    found = []
    for path in sorted((ROOT / "levelzero").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                where = f"{path.relative_to(ROOT)}:{node.lineno}"
                found.append((where, node.value, id(node) in docstrings))
    return found


def _headings(doc: Path) -> set[str]:
    return {
        line.lstrip("#").strip()
        for line in doc.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    }


def test_every_documentation_file_and_section_a_message_names_exists() -> None:
    named = 0
    for where, text, _ in _strings():
        for file, section in REFERENCE.findall(text):
            doc = ROOT / file
            assert doc.is_file(), f"{where} names {file}, which does not exist"
            if section:
                named += 1
                assert section in _headings(doc), f"{where} names {file}, '{section}': no such section"
    assert named >= 5  # the reconciler's ERROR line, recover, restore, backup, topic names


def test_no_message_points_at_a_readme_section() -> None:
    stale = [where for where, text, docstring in _strings() if "README" in text and not docstring]
    assert stale == [], f"messages naming the README (its sections live in docs/ now): {stale}"
