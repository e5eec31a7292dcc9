"""`levelzero install-files DIR`: write out the files an installation needs besides the program.

They ship inside the package (`levelzero/deploy/`), so a wheel installed anywhere can produce
the systemd unit, the annotated example configuration, the environment-file template, the
Grafana dashboard and the Prometheus alert rules that match its own version;
`packaging/install.sh` puts the first three in place. The environment file holds secrets: it
is written with mode 0600. An existing file is never overwritten unless asked
(`--force`), so re-running after an upgrade cannot clobber an operator's edits.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from levelzero.core.errors import directory_problem

DEPLOY_PACKAGE = "levelzero.deploy"

# file name -> mode. The unit and the example are public; the environment file holds secrets.
DEPLOY_FILES: dict[str, int] = {
    "levelzero.service": 0o644,
    "levelzero.toml": 0o644,
    "levelzero.env": 0o600,
    "grafana-dashboard.json": 0o644,
    "prometheus-alerts.yml": 0o644,
}


class InstallError(Exception):
    """One line for the operator: what could not be written and why."""


@dataclass(frozen=True)
class Written:
    path: Path
    mode: int


def deploy_text(name: str) -> str:
    """The shipped copy of one deployment file."""
    assert name in DEPLOY_FILES, name
    return resources.files(DEPLOY_PACKAGE).joinpath(name).read_text(encoding="utf-8")


def install_files(directory: str | os.PathLike[str], *, force: bool = False) -> list[Written]:
    """Write every deployment file into `directory` (created if missing). Nothing is written
    when any target exists and `force` is false: the operator gets one error naming them."""
    target = Path(directory)
    # A symbolic link is a file there too, a dangling one included: never written through
    # (it could point anywhere, the secret env file's mode then set on its target).
    existing = [name for name in DEPLOY_FILES if os.path.lexists(target / name)]
    if existing and not force:
        raise InstallError(
            f"{target}: {', '.join(existing)} already exist{'s' if len(existing) == 1 else ''} "
            "(--force overwrites)"
        )
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InstallError(directory_problem(target, exc)) from None
    try:
        written = []
        for name, mode in DEPLOY_FILES.items():
            path = target / name
            if path.is_symlink():  # (--force) the link is replaced, its target untouched
                path.unlink()
            # Created with its final mode, so a secret file is never readable by others.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(deploy_text(name))
            os.chmod(path, mode)
            written.append(Written(path, mode))
    except OSError as exc:
        raise InstallError(f"cannot write to {target}: {exc.strerror or exc}") from None
    return written
