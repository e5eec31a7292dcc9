#!/bin/sh
# Install (or upgrade) levelzero on a current Debian or Ubuntu as a systemd service:
#
#   the program      a virtual environment in /opt/levelzero (Debian 12 / Ubuntu 23.04+ refuse
#                    `pip install` into /usr/local; ProtectHome= hides /root and /home)
#   configuration    /etc/levelzero/levelzero.toml and /etc/levelzero/levelzero.env (0600),
#                    written only when missing, so an upgrade keeps the operator's edits
#   the unit         /etc/systemd/system/levelzero.service (replaced: it belongs to the version)
#
# Usage: sudo packaging/install.sh [WHAT]
#   WHAT is what pip installs: this source tree (the default), a wheel or sdist, or "levelzero".
# Environment:
#   ROOT=DIR             install below DIR instead of / (a scratch root: nothing is started)
#   PYTHON=python3       the interpreter the virtual environment is made from (3.11 or newer)
#   PIP_ARGS             extra pip arguments, e.g. "-c constraints.txt" or "--no-index --find-links DIR"
# Needs: python3 and python3-venv (apt-get install python3 python3-venv).
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
what=${1:-$here}
root=${ROOT:-}
python=${PYTHON:-python3}
venv="$root/opt/levelzero"
etc="$root/etc/levelzero"
units="$root/etc/systemd/system"

fail() { echo "install.sh: $*" >&2; exit 1; }

command -v "$python" >/dev/null 2>&1 || fail "$python not found (apt-get install python3 python3-venv)"
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "$python is older than 3.11"
if [ ! -x "$venv/bin/python" ]; then
    "$python" -m venv "$venv" || fail "cannot create $venv (apt-get install python3-venv)"
fi
# shellcheck disable=SC2086 # PIP_ARGS is a list of arguments
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade ${PIP_ARGS:-} "$what"
"$venv/bin/levelzero" --help >/dev/null

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
"$venv/bin/levelzero" install-files "$stage" >/dev/null
install -d -m 0755 "$etc" "$units"
[ -e "$etc/levelzero.toml" ] || install -m 0644 "$stage/levelzero.toml" "$etc/levelzero.toml"
[ -e "$etc/levelzero.env" ] || install -m 0600 "$stage/levelzero.env" "$etc/levelzero.env"
install -m 0644 "$stage/levelzero.service" "$units/levelzero.service"
"$venv/bin/levelzero" config show --config "$etc/levelzero.toml" >/dev/null \
    || fail "$etc/levelzero.toml is not valid (levelzero config show --config $etc/levelzero.toml)"

# The unit as systemd will read it. In a scratch root its ExecStart points into the root (the
# only path that exists here); everything else is checked as it is.
if command -v systemd-analyze >/dev/null 2>&1; then
    sed "s#^ExecStart=/opt/levelzero/#ExecStart=$venv/#" "$units/levelzero.service" > "$stage/levelzero.service"
    systemd-analyze verify "$stage/levelzero.service"
    # Exposure 0.0 (locked down) .. 10.0 (unprotected); --threshold is in tenths.
    systemd-analyze security --offline=yes --threshold=20 "$stage/levelzero.service" >"$stage/security.txt" \
        || { cat "$stage/security.txt" >&2; fail "the unit's hardening score is above 2.0"; }
    tail -n 1 "$stage/security.txt"
fi

echo "installed $("$venv/bin/levelzero" --version 2>/dev/null || echo levelzero) in $venv"
if [ -z "$root" ] && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    echo "start it:   systemctl enable --now levelzero && journalctl -u levelzero -f"
    echo "upgrade:    re-run this script, then systemctl restart levelzero"
fi
