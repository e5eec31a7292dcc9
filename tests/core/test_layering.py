"""The dependency direction of DESIGN.md ("Layers"), checked on the source with `ast`.

`levelzero/core` is pure and sans-IO: it imports only the standard library's pure modules,
msgspec and itself. `levelzero/actors` use storage only through protocols: never the daemon, never
a concrete storage adapter. The front ends (`http/`, `kafka/`) never import each other; `export`
opens its stores through storage, never through the daemon or a front end; the tests never
import the benchmarks (but for the benchmarks' own tests); no module imports itself through a
cycle of modules. The front ends never import the daemon or the CLI either: the daemon wires
them.
"""

from __future__ import annotations

import ast
import sys
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

# Beside CORE_FORBIDDEN's names, core imports only the standard library and msgspec.
CORE_ALLOWED_THIRD_PARTY = frozenset({"msgspec"})

# Where a layer or front end must not reach: (folder, forbidden prefixes).
FORBIDDEN_BETWEEN = (
    # The daemon wires the front ends (it builds their apps and passes what they need); a front
    # end never imports the daemon or the CLI.
    ("http", ("levelzero.kafka", "levelzero.daemon", "levelzero.cli")),
    ("kafka", ("levelzero.http", "levelzero.daemon", "levelzero.cli")),
    ("export", ("levelzero.daemon", "levelzero.http", "levelzero.kafka", "levelzero.cli")),
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
            elif top not in sys.stdlib_module_names and top not in CORE_ALLOWED_THIRD_PARTY | {"levelzero"}:
                found.append(f"{where} imports {module} (core imports the standard library and msgspec only)")
            elif (
                top == "levelzero"
                and module != "levelzero"
                and not (module == "levelzero.core" or module.startswith("levelzero.core."))
            ):
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


def prefix_violations(root: Path, folder: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in python_files(root / folder):
        for line, module in imported_modules(path, root):
            for prefix in forbidden:
                if module == prefix or module.startswith(prefix + "."):
                    where = f"{path.relative_to(root.parent)}:{line}"
                    found.append(f"{where} imports {module} ({folder}/ must not reach {prefix})")
    return sorted(set(found))


def module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the levelzero modules it imports (anywhere in it: top level, in a function, under
    TYPE_CHECKING); `from package import name` counts as importing the submodule where there is one."""
    modules = {module_name(p, root): p for p in python_files(root)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        graph[name] = {m for _, m in imported_modules(path, root) if m in modules and m != name}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return sorted(cycles)


def is_package_init_edge(importer: str, imported: str) -> bool:
    """A package's `__init__` importing its own submodules is not a cycle of layers."""
    return imported.startswith(importer + ".")


def bench_imports_in_tests(tests_root: Path) -> list[str]:
    found = []
    for path in python_files(tests_root):
        if "bench" in path.relative_to(tests_root).parts[:1]:
            continue  # the benchmarks' own tests
        for line, module in imported_modules(path, tests_root):
            if module == "levelzero.bench" or module.startswith("levelzero.bench."):
                found.append(f"{path.relative_to(tests_root.parent)}:{line} imports {module}")
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


@pytest.mark.parametrize(("folder", "forbidden"), FORBIDDEN_BETWEEN)
def test_front_ends_and_export_import_only_downwards(folder: str, forbidden: tuple[str, ...]) -> None:
    assert python_files(PACKAGE_ROOT / folder), f"levelzero/{folder} has no modules"
    assert prefix_violations(PACKAGE_ROOT, folder, forbidden) == []


def test_no_import_cycles() -> None:
    graph = import_graph(PACKAGE_ROOT)
    graph = {m: {i for i in imported if not is_package_init_edge(m, i)} for m, imported in graph.items()}
    assert "levelzero.actors.node" in graph and "levelzero.daemon.service" in graph
    assert import_cycles(graph) == []


def test_tests_never_import_the_benchmarks() -> None:
    tests_root = Path(__file__).resolve().parents[1]
    assert (tests_root / "conftest.py").is_file()
    assert bench_imports_in_tests(tests_root) == []


# ---------------------------------------------------------------- the checker can fail


def test_checker_flags_a_front_end_importing_another_and_export_reaching_the_daemon(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "http/app.py": (
                "from levelzero.kafka.records import KafkaRecord\nfrom levelzero.actors.node import Node\n"
                "def f():\n    import levelzero.daemon.metrics\n"
            ),
            "kafka/server.py": (
                "import levelzero.http.schema\nfrom levelzero.kafkaesque import x\n"
                "import levelzero.cli.client\n"
            ),
            "export/spark_source.py": (
                "from levelzero.storage.opening import open_object_store\n"
                "def f():\n    from levelzero.daemon.service import open_object_store\n"
            ),
        },
    )
    flagged = {
        folder: [v.split(" imports ")[1].split(" ")[0] for v in prefix_violations(root, folder, forbidden)]
        for folder, forbidden in FORBIDDEN_BETWEEN
    }
    assert flagged == {
        "http": [
            "levelzero.kafka.records",
            "levelzero.kafka.records.KafkaRecord",
            "levelzero.daemon.metrics",
        ],
        "kafka": ["levelzero.http.schema", "levelzero.cli.client"],
        "export": ["levelzero.daemon.service", "levelzero.daemon.service.open_object_store"],
    }


def test_checker_finds_an_import_cycle(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from levelzero import b\n",
            "b.py": "def f():\n    from levelzero.c import g\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from levelzero.a import x\n",
            "d.py": "from levelzero import a\n",
        },
    )
    assert import_cycles(import_graph(root)) == [["levelzero.a", "levelzero.b", "levelzero.c"]]
    (root / "c.py").write_text("import json\n", encoding="utf-8")
    assert import_cycles(import_graph(root)) == []


def test_checker_flags_a_test_importing_the_benchmarks(tmp_path: Path) -> None:
    tests_root = tmp_path / "tests"
    for relative, text in {
        "conftest.py": "from levelzero.testing.moto import moto_process\n",
        "bench/test_gc.py": "from levelzero.bench.gc import run\n",
        "storage/test_x.py": "import levelzero.bench.common\n",
    }.items():
        (tests_root / relative).parent.mkdir(parents=True, exist_ok=True)
        (tests_root / relative).write_text(text, encoding="utf-8")
    assert bench_imports_in_tests(tests_root) == ["tests/storage/test_x.py:1 imports levelzero.bench.common"]


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
                "import aiokafka.record\n"
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
        "aiokafka.record",
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
    return {module for path in python_files(root / "sim") for _, module in imported_modules(path, root)}


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
    root = write_tree(tmp_path, {"sim/world.py": "from levelzero.actors.node import Node\n"})
    assert "levelzero.actors.node.Node" in sim_imports(root)
