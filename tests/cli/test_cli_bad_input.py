"""Bad input to the command line and the daemon is an error that says what is wrong, in one
line, with exit 2 for bad usage: never a traceback, never a wrong answer. Each case here was
found by trying the commands as a new user would (a traceback, a record printed for
`--max-records 0`, "split the request" for one record that cannot be split, ...)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from daemon_support import DaemonProcess, clean_environ
from levelzero.cli.main import main
from levelzero.cli.parser import build_parser, settle_client_options
from levelzero.http.schema import UNSIGNED_MAX
from levelzero.storage.sqlite import SqliteLogStore


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """The one error line of a command refused as bad usage (exit 2), before any request."""
    with pytest.raises(SystemExit) as raised:
        main(list(argv))
    assert raised.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["produce", "t", "--key-separator", "", "x"],
            "--key-separator: the key separator must not be empty",
        ),
        (["consume", "t", "--max-records", "0"], "--max-records: 0 is not >= 1"),
        (["consume", "t", "--max-bytes", "-5"], "--max-bytes: -5 is not >= 1"),
        (["consume", "t", "--follow", "--poll-max-s", "0"], "--poll-max-s: 0 is not a positive number"),
        (["produce", "t", "--timeout", "0", "x"], "--timeout: 0 is not a positive number of seconds"),
        (["produce", "t", "--timeout", "nan", "x"], "--timeout: nan is not a positive number of seconds"),
        (["consume", "t", "--offset", "abc"], "--offset: 'abc' is not an integer"),
        (["consume", "t", "--offset", "123456789012345678901"], f"is above {UNSIGNED_MAX}"),
        (["consume", "t", "--offset", "-1"], "--offset: -1 is negative"),
        (["compaction", "explain", "garbage"], "TOPIC/P: 'garbage' is not TOPIC/PARTITION (e.g. orders/3)"),
        (["topics", "create", "t", "--partitions", "0"], "--partitions: 0 is not >= 1"),
        (["topics", "create", "t", "--partitions", "two"], "--partitions: 'two' is not an integer"),
        (
            ["produce", "t", "--batch-records", "1000001", "x"],
            "--batch-records: 1000001 is above 1,000,000, the most any server takes",
        ),
    ],
)
def test_bad_flag_values_are_refused_by_name(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    line = usage_error(capsys, *argv)
    command = " ".join(argv[:2] if argv[0] in ("compaction", "topics") else argv[:1])
    assert line.startswith(f"levelzero {command}: error: argument ") and expected in line, line


def test_a_stray_flag_is_reported_with_its_own_commands_usage(capsys: pytest.CaptureFixture[str]) -> None:
    assert usage_error(capsys, "produce", "t", "x", "--bogus") == (
        "levelzero produce: error: unrecognized arguments: --bogus"
    )
    assert (
        usage_error(capsys, "gc", "run", "--bogus")
        == "levelzero gc run: error: unrecognized arguments: --bogus"
    )


@pytest.mark.parametrize("argv", [["backup", "DEST"], ["restore", "BACKUP"], ["recover", "--from-bucket"]])
def test_listen_is_bad_usage_where_nothing_listens(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Only `run` (and `config show`, which prints what `run` would use) take --listen; the
    others accepted it and ignored it."""
    assert usage_error(capsys, *argv, "--listen", "127.0.0.1:9") == (
        f"levelzero {argv[0]}: error: unrecognized arguments: --listen 127.0.0.1:9"
    )


def test_every_command_argument_and_option_has_a_one_line_help() -> None:
    """A walk of the parser behind `levelzero --help` and every `levelzero CMD --help`: each
    subcommand, positional argument and option says what it is (several said nothing)."""
    unexplained = []

    def walk(parser: argparse.ArgumentParser, command: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {choice.dest: choice.help for choice in action._choices_actions}
                for name, child in action.choices.items():
                    if not helps.get(name, "").strip() or "\n" in helps[name]:
                        unexplained.append(f"{command} {name}")
                    walk(child, f"{command} {name}")
            elif not (action.help or "").strip() or action.help == argparse.SUPPRESS or "\n" in action.help:
                unexplained.append(f"{command} {'/'.join(action.option_strings) or action.dest}")

    walk(build_parser(), "levelzero")
    assert unexplained == []


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://127.0.0.1:99999", "port 99999 is not in 1..65535"),
        ("http://127.0.0.1:0", "port 0 is not in 1..65535"),
        ("http://[::1", "is malformed"),
        ("http://", "names no host"),
        ("127.0.0.1:8420", "has no http:// or https:// scheme"),
    ],
)
def test_a_bad_daemon_url_is_a_usage_error_before_any_request(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, url: str, expected: str
) -> None:
    assert main(["status", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"levelzero: daemon URL {url!r}") and expected in err and "Traceback" not in err
    monkeypatch.setenv("LEVELZERO_URL", url)  # the same from the environment, which it names
    assert main(["status"]) == 2
    assert capsys.readouterr().err.startswith(f"levelzero: $LEVELZERO_URL: daemon URL {url!r}")


def test_client_options_are_taken_before_the_command_too_and_after_it_wins(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`levelzero --url URL cluster` was refused (the options were the subcommands' only)."""
    monkeypatch.setenv("LEVELZERO_TOKEN", "from-the-environment")

    def parsed(*argv: str) -> tuple[str | None, str | None, float]:
        args = build_parser().parse_args(argv)
        settle_client_options(args)
        return args.url, args.token, args.timeout

    before = ("--url", "http://a.example:1", "--token", "t-before", "--timeout", "5")
    assert parsed(*before, "cluster") == ("http://a.example:1", "t-before", 5.0)
    assert parsed(*before, "topics", "list", "--url", "http://b.example:2", "--timeout", "7") == (
        "http://b.example:2",
        "t-before",
        7.0,
    )
    assert parsed("gc", "pause") == (None, "from-the-environment", 60.0)  # the defaults
    # The one given before reaches the request; the one after replaces it.
    assert main(["--url", "http://127.0.0.1:99999", "cluster"]) == 2
    assert "daemon URL 'http://127.0.0.1:99999'" in capsys.readouterr().err
    assert main(["--url", "http://127.0.0.1:99999", "status", "--url", "127.0.0.1:8"]) == 2
    assert "daemon URL '127.0.0.1:8' has no http://" in capsys.readouterr().err
    # Before a command that talks to no daemon, it is bad usage rather than ignored.
    assert "--url is an option of the commands that talk to a daemon only" in usage_error(
        capsys, "--url", "http://a.example:1", "config", "show"
    )


def test_help_names_the_url_default_not_this_shells_value(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LEVELZERO_URL", "http://secret-host.example:1")
    with pytest.raises(SystemExit):
        main(["status", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "default $LEVELZERO_URL, else http://127.0.0.1:8420" in out and "secret-host" not in out


def test_an_invalid_choice_in_the_configuration_lists_the_valid_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "levelzero.toml"
    path.write_text('[logging]\nlevel = "loud"\n')
    assert main(["config", "show", "--config", str(path)]) == 2
    assert capsys.readouterr().err == (
        f"levelzero: invalid configuration ({path}): logging.level: Invalid enum value 'loud' "
        "(one of 'debug', 'info', 'warning', 'error')\n"
    )
    monkeypatch.setenv("LEVELZERO_STORAGE_KIND", "disk")
    assert main(["config", "show"]) == 2
    assert capsys.readouterr().err == (
        "levelzero: environment variable LEVELZERO_STORAGE_KIND (storage.kind) = 'disk': "
        "Invalid enum value 'disk' (one of 'local', 's3')\n"
    )


def test_a_bad_flag_or_variable_is_blamed_on_it_not_on_the_configuration_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "ok.toml"
    path.write_text('[server]\nlisten = "127.0.0.1:8421"\n')
    assert main(["config", "show", "--config", str(path), "--listen", "bar"]) == 2
    assert capsys.readouterr().err == (
        "levelzero: invalid configuration (flag --listen): server: listen must be HOST:PORT "
        "(e.g. 127.0.0.1:8420), not 'bar'\n"
    )
    monkeypatch.setenv("LEVELZERO_LISTEN", "foo")
    assert main(["config", "show", "--config", str(path)]) == 2
    assert capsys.readouterr().err.startswith(
        "levelzero: invalid configuration (environment variable LEVELZERO_LISTEN): server: listen"
    )


def test_a_data_dir_that_is_a_file_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    in_the_way = tmp_path / "data"
    in_the_way.write_text("not a directory")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "levelzero.cli",
            "run",
            "--data-dir",
            str(in_the_way),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        timeout=120,
        env=clean_environ(),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.decode().endswith(
        f"levelzero: data_dir: {in_the_way} is a file, not a directory: "
        "move it away or set another storage.data_dir\n"
    )
    # The other commands that make a directory say the same of a file in the way.
    assert main(["install-files", str(in_the_way)]) == 1
    assert main(["install-files", str(in_the_way / "sub")]) == 1
    store = tmp_path / "store"

    async def create_store() -> None:
        async with await SqliteLogStore.open(str(store / "levelzero.db")):
            pass

    store.mkdir()
    anyio.run(create_store)
    assert main(["export", "--data-dir", str(store), "--out", str(in_the_way)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"levelzero: {in_the_way} is a file, not a directory",
        f"levelzero: {in_the_way / 'sub'}: a part of the path is a file, not a directory",
        f"levelzero export: output directory: {in_the_way} is a file, not a directory",
    ]


def test_bad_input_against_a_daemon(daemon_process: DaemonProcess, tmp_path: Path) -> None:
    assert daemon_process.cli("topics", "create", "b", "--partitions", "2").returncode == 0
    assert daemon_process.cli("topics", "create", "other").returncode == 0
    assert daemon_process.cli("produce", "b", "v0", "v1", "v2").returncode == 0
    # --max-records 1 prints one record (0 is refused above, it printed one).
    result = daemon_process.cli("consume", "b", "--max-records", "1", "--format", "offsets")
    assert result.stdout == b"0\tv0\n"
    # A malformed VALUE argument is named as an argument, not as an input line.
    result = daemon_process.cli("produce", "b", "--key-separator", ":", "k:v", "novalue")
    assert result.returncode == 1
    assert result.stderr.startswith(b"levelzero: VALUE argument 2: no key separator ':' in b'novalue'")
    # One record over the limit cannot be split: the answer does not say "split the request".
    big = tmp_path / "big"
    big.write_bytes(b"a" * (5 << 20) + b"\n")
    result = daemon_process.cli("produce", "b", input=big.read_bytes())
    assert result.returncode == 1
    message = result.stderr.decode()
    assert "5242888 record bytes exceed batch_bytes_max 4194304" in message
    assert "one record cannot be larger than the limit (too_large, HTTP 413)" in message
    assert "split the request" not in message
    # The command splits its input by size itself (two such records: two requests)...
    two = tmp_path / "two"
    two.write_bytes(b"a" * (3 << 20) + b"\n" + b"b" * (3 << 20) + b"\n")
    result = daemon_process.cli("produce", "b", "--batch-records", "2", input=two.read_bytes())
    assert result.returncode == 0 and b"produced 2 records to b/0" in result.stdout
    with daemon_process.http() as http:
        # ...a request of two records over the limit can be split: that answer says so.
        value = base64.b64encode(b"a" * (9 << 18)).decode()  # 2.25 MiB, 3 MiB in base64
        response = http.post("/v1/topics/b/partitions/0/records", json={"records": [{"value": value}] * 2})
        assert response.status_code == 413
        assert response.json()["message"].endswith("8 per record); split the request")
        # An offset too large for the API is out of range, not "not a non-negative integer".
        response = http.get("/v1/topics/b/partitions/0/records", params={"offset": "123456789012345678901"})
    assert response.status_code == 400
    assert response.json()["message"] == (
        f"offset 123456789012345678901 is out of range (at most {UNSIGNED_MAX})"
    )
    # A timestamp outside Kafka's int64 is refused (2**63 was stored, then crashed the
    # reconciler and Kafka fetches); a topic config of NaN too (it crashed the compactor).
    with daemon_process.http() as http:
        for ts in (2**63, 2**64, 10**20, -1):
            body = {"records": [{"value": "aGk=", "timestamp_ms": ts}]}
            response = http.post("/v1/topics/b/partitions/0/records", json=body)
            assert response.status_code == 400, (ts, response.text)
            assert "timestamp_ms must be in 0..9223372036854775807" in response.json()["message"]
        for ratio in ("NaN", "nan", "inf"):
            configs = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": ratio}
            response = http.post("/v1/topics", json={"name": "c", "partitions": 1, "configs": configs})
            assert response.status_code == 400 and "Not a number of type DOUBLE" in response.text, ratio
        for ms in ("5_0", "\u0665"):
            response = http.patch("/v1/topics/b/configs", json={"configs": {"retention.ms": ms}})
            assert response.status_code == 400 and "Not a number of type LONG" in response.text, ms
    # A parameter given twice is refused, not read as its last value.
    with daemon_process.http() as http:
        for query in ("offset=0&offset=1", "max_bytes=10&max_bytes=20"):
            response = http.get(f"/v1/topics/b/partitions/0/records?{query}")
            assert response.status_code == 400
            name = query.split("=")[0]
            assert response.json()["message"] == f"query parameter {name!r} given more than once"
    # `status --topic` as the HTTP API's ?topic=: that topic's partitions only.
    shown = json.loads(daemon_process.cli("status", "--topic", "b", "--all", "--json").stdout)
    assert [(p["topic"], p["partition"]) for p in shown["partitions"]] == [("b", 0), ("b", 1)]
    shown = json.loads(daemon_process.cli("status", "--topic", "b", "--json").stdout)
    assert shown["partitions_total"] == 2
    result = daemon_process.cli("status", "--topic", "nope")
    assert result.returncode == 1 and b"unknown topic 'nope'" in result.stderr
    # `compaction explain` of a partition the daemon does not have fails as a fetch of it does
    # (it exited 0, saying the compactor had not seen it).
    for args in (("nope/0",), ("nope/0", "--json")):
        result = daemon_process.cli("compaction", "explain", *args)
        assert (result.returncode, result.stdout) == (1, b"")
        assert result.stderr == b"levelzero: unknown topic 'nope' (unknown_topic, HTTP 404)\n"
    result = daemon_process.cli("compaction", "explain", "b/2")
    assert (result.returncode, result.stderr) == (1, b"levelzero: unknown partition b/2\n")
    result = daemon_process.cli("compaction", "explain", "b/1")  # not compacted, but there
    assert result.returncode == 0 and result.stdout.startswith(b"b/1: not seen by this node's compactor")


PIPE_RECORDS = 50_000  # 350 KB of output: more than a pipe and `head`'s read together hold


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "levelzero.cli", *args]


def test_a_reader_that_goes_away_ends_the_command_quietly(daemon_process: DaemonProcess) -> None:
    """`levelzero consume t | head -1` printed a BrokenPipeError traceback; it exits 141, as the
    shell reports for `cat` there, and says nothing."""
    values = b"".join(b"v%05d\n" % i for i in range(PIPE_RECORDS))
    assert daemon_process.cli("topics", "create", "pipe").returncode == 0
    assert daemon_process.cli("produce", "pipe", input=values).returncode == 0
    env = clean_environ(LEVELZERO_URL=daemon_process.url)
    consume = subprocess.Popen(
        cli_argv("consume", "pipe"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert consume.stdout is not None and consume.stderr is not None
    head = subprocess.Popen(["head", "-1"], stdin=consume.stdout, stdout=subprocess.PIPE)
    consume.stdout.close()  # head is its only reader
    first, _ = head.communicate(timeout=60)
    err = consume.stderr.read()
    assert (first, consume.wait(timeout=60), err) == (b"v00000\n", 141, b"")
    # A reader gone before the first write (`topics list | true`): the same.
    for args in (("topics", "list"), ("status",)):
        reader, writer = os.pipe()
        os.close(reader)
        try:
            result = subprocess.run(
                cli_argv(*args), stdout=writer, stderr=subprocess.PIPE, env=env, timeout=60
            )
        finally:
            os.close(writer)
        assert (result.returncode, result.stderr) == (141, b""), args
