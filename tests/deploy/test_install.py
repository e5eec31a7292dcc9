"""The install path an operator follows: the sdist carries everything, the wheel built from it
ships the unit, the example configuration, the env template and the licence as package data,
`levelzero install-files` writes them out, and packaging/install.sh installs into a scratch root
(a venv under opt/levelzero, /etc files, the unit) and checks the unit with systemd-analyze."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from levelzero.cli.main import main
from levelzero.config import load_config

REPO = Path(__file__).resolve().parents[2]
WHEEL_VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
SHIPPED = (
    "levelzero.service",
    "levelzero.toml",
    "levelzero.env",
    "grafana-dashboard.json",
    "prometheus-alerts.yml",
)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sdist, wheel): the wheel is built from the unpacked sdist, as `python -m build` does,
    so a file missing from the sdist is missing from the wheel too. Offline: the build
    backend is this environment's setuptools."""
    out = tmp_path_factory.mktemp("dist")
    name = (
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"from setuptools import build_meta; print(build_meta.build_sdist({str(out)!r}))",
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    sdist = out / name
    unpacked = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(sdist) as archive:
        archive.extractall(unpacked, filter="data")
    [source] = list(unpacked.iterdir())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    [wheel] = list(out.glob("levelzero-*.whl"))
    return sdist, wheel


def test_sdist_carries_licence_schemas_unit_and_install_script(dists: tuple[Path, Path]) -> None:
    sdist, _ = dists
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    for wanted in (
        "LICENSE",
        "README.md",
        "DESIGN.md",
        "docs/operating.md",
        "docs/configuration.md",
        "constraints.txt",
        "Containerfile",
        "packaging/install.sh",
        "levelzero/export/SCHEMAS.md",
        *(f"levelzero/deploy/{f}" for f in SHIPPED),
    ):
        assert wanted in names, wanted


def test_wheel_ships_deploy_files_schemas_and_an_spdx_licence(dists: tuple[Path, Path]) -> None:
    _, wheel = dists
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        headers = archive.read(metadata).decode()
    for shipped in SHIPPED:
        assert f"levelzero/deploy/{shipped}" in names
    assert "levelzero/export/SCHEMAS.md" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in headers.splitlines()
    assert "License-File: LICENSE" in headers.splitlines()


def test_install_files_writes_the_unit_the_example_and_a_private_env(tmp_path: Path, capsys) -> None:
    target = tmp_path / "etc"
    assert main(["install-files", str(target)]) == 0
    assert sorted(p.name for p in target.iterdir()) == sorted(SHIPPED)
    assert stat.S_IMODE((target / "levelzero.env").stat().st_mode) == 0o600
    assert stat.S_IMODE((target / "levelzero.toml").stat().st_mode) == 0o644
    assert (target / "levelzero.service").read_text() == (
        REPO / "levelzero/deploy/levelzero.service"
    ).read_text()
    config = load_config(str(target / "levelzero.toml"), environ={})
    assert config.storage.data_dir == "/var/lib/levelzero"
    assert f"wrote {target / 'levelzero.env'} (mode 0600)" in capsys.readouterr().out


def test_install_files_never_overwrites_without_force(tmp_path: Path, capsys) -> None:
    (tmp_path / "levelzero.toml").write_text("# the operator's own\n")
    assert main(["install-files", str(tmp_path)]) == 1
    assert "levelzero.toml already exists (--force overwrites)" in capsys.readouterr().err
    assert (tmp_path / "levelzero.toml").read_text() == "# the operator's own\n"
    assert not (tmp_path / "levelzero.service").exists()  # all or nothing
    assert main(["install-files", "--force", str(tmp_path)]) == 0
    assert "[storage]" in (tmp_path / "levelzero.toml").read_text()


def test_install_files_never_writes_through_a_symbolic_link(tmp_path: Path, capsys) -> None:
    """A dangling link at the env file's path was followed without --force (a file made where
    it pointed), and with --force an existing link's target was overwritten and made 0600. A
    link counts as a file there; --force replaces the link, not its target."""
    target, elsewhere = tmp_path / "etc", tmp_path / "elsewhere"
    target.mkdir()
    elsewhere.mkdir()
    (target / "levelzero.env").symlink_to(elsewhere / "planted.env")  # dangling
    assert main(["install-files", str(target)]) == 1
    assert "levelzero.env already exists (--force overwrites)" in capsys.readouterr().err
    assert not (elsewhere / "planted.env").exists()
    (elsewhere / "planted.env").write_text("someone else's\n")
    (elsewhere / "planted.env").chmod(0o644)
    assert main(["install-files", "--force", str(target)]) == 0
    assert (elsewhere / "planted.env").read_text() == "someone else's\n"
    assert stat.S_IMODE((elsewhere / "planted.env").stat().st_mode) == 0o644
    env = target / "levelzero.env"
    assert not env.is_symlink() and stat.S_IMODE(env.stat().st_mode) == 0o600


def _scratch_venv(root: Path) -> Path:
    """opt/levelzero as the script would make it, except that the dependencies come from this
    environment (a .pth line) instead of the package index: the test stays offline."""
    venv = root / "opt" / "levelzero"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    [site] = list(venv.glob("lib/python3*/site-packages"))
    (site / "dependencies-from-test-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_install_script_installs_into_a_scratch_root(dists: tuple[Path, Path], tmp_path: Path) -> None:
    _, wheel = dists
    root = tmp_path / "root"
    venv = _scratch_venv(root)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEVELZERO_")}
    env.update(ROOT=str(root), PYTHON=sys.executable, PIP_ARGS="--no-index --no-deps")

    def install() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / "packaging" / "install.sh"), str(wheel)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    first = install()
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"installed levelzero {WHEEL_VERSION} in {venv}" in first.stdout
    assert "Overall exposure level for levelzero.service: 1." in first.stdout  # security --offline
    program = venv / "bin" / "levelzero"
    assert (venv / "lib").is_dir() and program.exists()
    # The installed program is the wheel's, not this source tree's.
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import levelzero; print(levelzero.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(str(venv)), where
    unit = (root / "etc/systemd/system/levelzero.service").read_text()
    assert "ExecStart=/opt/levelzero/bin/levelzero run --config /etc/levelzero/levelzero.toml\n" in unit
    env_file = root / "etc/levelzero/levelzero.env"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
    assert (
        load_config(str(root / "etc/levelzero/levelzero.toml"), environ={}).storage.data_dir
        == "/var/lib/levelzero"
    )
    # Upgrading is running it again: the operator's configuration stays as they left it.
    env_file.write_text("LEVELZERO_TOKEN=an-operator-secret-token\n")
    again = install()
    assert again.returncode == 0, again.stdout + again.stderr
    assert env_file.read_text() == "LEVELZERO_TOKEN=an-operator-secret-token\n"
