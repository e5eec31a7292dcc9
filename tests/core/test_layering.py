"""The dependency direction of DESIGN.md ("Layers"), checked on the source with `ast`.

`levelzero/core` is pure and sans-IO: it imports no I/O or concurrency library and nothing else
of levelzero. `levelzero/actors` use storage only through protocols: never the daemon, never a
concrete storage adapter.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

import levelzero

PACKAGE_ROOT = Path(levelzero.__file__).resolve().parent

# Top-level modules the pure core must not import: I/O, networking, concurrency, clocks,
# process control, and the frameworks of the outer layers.
CORE_FORBIDDEN = frozenset(
    {
        "anyio",
        "asyncio",
        "aiosqlite",
        "sqlite3",
        "aiobotocore",
        "botocore",
        "boto3",
        "socket",
        "starlette",
        "uvicorn",
        "httpx",
        "trio",
        "threading",
        "subprocess",
        "os",
        "io",
        "pathlib",
        "shutil",
        "tempfile",
        "glob",
        "multiprocessing",
        "concurrent",
        "selectors",
        "select",
        "signal",
        "ssl",
        "http",
        "urllib",
        "aiohttp",
        "requests",
        "time",
        "importlib",
        "prometheus_client",
        "pyarrow",
        "pyspark",
    }
)

ACTORS_FORBIDDEN_PREFIXES = (
    "levelzero.daemon",
    "levelzero.storage.sqlite",
    "levelzero.storage.postgres",
    "levelzero.storage.s3_store",
    "levelzero.storage.local_store",
    "levelzero.storage.memory_store",
    "levelzero.storage.memory_log",
)


def python_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*.py") if "__pycache__" not in p.parts)


def module_package(path: Path, root: Path) -> str:
    """The package a module's relative imports resolve against (`root` is levelzero/)."""
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1])  # a module's package; for `__init__` the package itself


def imported_modules(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, dotted module) for every import; `from m import n` yields `m` and `m.n`, since
    `n` may be a submodule."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module_package(path, root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                assert base, f"{path}:{node.lineno}: relative import escapes the package"
                module = ".".join([*base, node.module] if node.module else base)
            else:
                assert node.module is not None
                module = node.module
            yield node.lineno, module
            for alias in node.names:
                if alias.name != "*":
                    yield node.lineno, f"{module}.{alias.name}"


def core_violations(root: Path) -> list[str]:
    found = []
    for path in python_files(root / "core"):
        for line, module in imported_modules(path, root):
            top = module.split(".")[0]
            where = f"{path.relative_to(root.parent)}:{line}"
            if top in CORE_FORBIDDEN:
                found.append(f"{where} imports {module} (I/O or concurrency in the pure core)")
            elif top == "levelzero" and module != "levelzero":
                if not (module == "levelzero.core" or module.startswith("levelzero.core.")):
                    found.append(f"{where} imports {module} (core imports no other layer)")
    return sorted(set(found))


def actors_violations(root: Path) -> list[str]:
    found = []
    for path in python_files(root / "actors"):
        for line, module in imported_modules(path, root):
            for prefix in ACTORS_FORBIDDEN_PREFIXES:
                if module == prefix or module.startswith(prefix + "."):
                    where = f"{path.relative_to(root.parent)}:{line}"
                    found.append(f"{where} imports {module} (actors use storage protocols only)")
    return sorted(set(found))


# ---------------------------------------------------------------- the real tree


def test_core_imports_no_io_and_no_other_layer() -> None:
    modules = python_files(PACKAGE_ROOT / "core")
    names = {p.stem for p in modules}
    assert {"entries", "errors", "keys", "state", "fence", "gc"} <= names
    assert core_violations(PACKAGE_ROOT) == []


def test_actors_use_no_daemon_and_no_concrete_storage_adapter() -> None:
    modules = [p for p in python_files(PACKAGE_ROOT / "actors") if p.name != "__init__.py"]
    if not modules:
        pytest.skip("levelzero/actors has no modules yet")
    assert actors_violations(PACKAGE_ROOT) == []


# ---------------------------------------------------------------- the checker can fail


def write_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "levelzero"
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_checker_flags_forbidden_core_imports(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "core/__init__.py": "",
            "core/good.py": (
                "import re\nimport msgspec\nfrom .errors import X\nfrom . import keys\n"
                "from levelzero.core.state import PartitionState\n"
            ),
            "core/bad.py": (
                "import anyio\n"
                "import os.path\n"
                "from threading import Lock\n"
                "from levelzero.storage import protocols\n"
                "from .. import daemon\n"
                "from ..actors.partition import PartitionActor\n"
                "def f():\n    import sqlite3\n"
            ),
        },
    )
    violations = core_violations(root)
    flagged = {v.split(" imports ")[1].split(" ")[0] for v in violations}
    assert flagged == {
        "anyio",
        "os.path",
        "threading",
        "threading.Lock",
        "levelzero.storage",
        "levelzero.storage.protocols",
        "levelzero.daemon",
        "levelzero.actors.partition",
        "levelzero.actors.partition.PartitionActor",
        "sqlite3",
    }
    assert all(v.startswith("levelzero/core/bad.py:") for v in violations)


def test_checker_flags_concrete_adapters_in_actors(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "actors/__init__.py": "",
            "actors/good.py": (
                "from levelzero.storage.protocols import LogStore\n"
                "from levelzero.core.fence import Fence\nfrom .mailbox import mailbox\n"
            ),
            "actors/bad.py": (
                "from levelzero.storage import memory_store\n"
                "from levelzero.storage.s3_store import S3Store\n"
                "import levelzero.storage.sqlite.store\n"
                "from ..storage.local_store import LocalStore\n"
                "from levelzero.daemon.config import Config\n"
            ),
        },
    )
    violations = actors_violations(root)
    assert all(v.startswith("levelzero/actors/bad.py:") for v in violations)
    flagged_lines = {int(v.split(":")[1].split(" ")[0]) for v in violations}
    assert flagged_lines == {1, 2, 3, 4, 5}


# ---------------------------------------------------------------- the simulation


SIM_MODEL_MODULES = frozenset(
    {"leader", "batcher", "reconciler", "housekeeper", "gc_worker", "readers", "stores", "model"}
)


def sim_imports(root: Path) -> set[str]:
    return {
        module
        for path in python_files(root / "sim")
        for _, module in imported_modules(path, root)
    }


def test_simulation_runs_the_shipping_actors_and_keeps_no_model_of_them() -> None:
    """The simulation must import the actors (it runs the real `Node`), must not keep copies of
    them, and wires only the memory adapters (never the daemon)."""
    imported = sim_imports(PACKAGE_ROOT)
    assert "levelzero.actors.node.Node" in imported
    assert "levelzero.storage.memory_store.MemoryObjectStore" in imported
    assert "levelzero.storage.memory_log.MemoryLogStore" in imported
    assert not [m for m in imported if m.startswith("levelzero.daemon")]
    assert SIM_MODEL_MODULES.isdisjoint(p.stem for p in python_files(PACKAGE_ROOT / "sim"))


def test_sim_checker_sees_a_missing_actor_import(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {"sim/__init__.py": "", "sim/world.py": "from levelzero.core.state import PartitionState\n"},
    )
    assert "levelzero.actors.node.Node" not in sim_imports(root)
    root = write_tree(
        tmp_path, {"sim/world.py": "from levelzero.actors.node import Node\n"}
    )
    assert "levelzero.actors.node.Node" in sim_imports(root)
