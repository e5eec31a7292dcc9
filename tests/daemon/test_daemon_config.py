"""Configuration: defaults, TOML, environment and flags, each validated with a message naming
the key; and the logging formatters."""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from levelzero.actors.gc import GcConfig
from levelzero.actors.housekeeper import HousekeeperConfig
from levelzero.actors.reconciler import ReconcilerConfig
from levelzero.cli.main import main
from levelzero.config import (
    Config,
    ConfigError,
    GcSection,
    describe,
    load_config,
    parse_listen,
    secrets_readable_by_others,
)
from levelzero.core.fence import FenceMode
from levelzero.daemon.logs import JsonFormatter, KeyValueFormatter, configure_logging

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "levelzero" / "deploy" / "levelzero.toml"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "levelzero.toml"
    path.write_text(text)
    return str(path)


def test_no_configuration_runs_on_embedded_defaults() -> None:
    config = load_config(None, environ={})
    assert config.storage.kind == "local"
    assert config.storage.data_dir == "./levelzero-data"
    assert config.storage.db_path == "./levelzero-data/levelzero.db"
    assert config.storage.objects_dir == "./levelzero-data/objects"
    assert config.server.listen == "127.0.0.1:8420"
    assert config.node_config().fencing_mode is FenceMode.WINDOWED


def test_documented_example_is_valid_and_equals_the_defaults_but_the_data_dir() -> None:
    example = load_config(str(EXAMPLE), environ={})
    assert example.storage.data_dir == "/var/lib/levelzero"  # the unit's StateDirectory
    assert example == msgspec.structs.replace(
        Config(), storage=msgspec.structs.replace(Config().storage, data_dir="/var/lib/levelzero")
    )


def test_actor_sections_default_to_the_actors_defaults() -> None:
    node = Config().node_config()
    assert node.reconciler == ReconcilerConfig()
    assert node.housekeeper == HousekeeperConfig()  # retention 0 in TOML is None: off
    assert node.gc == GcConfig()


def test_actor_sections_reach_the_node_config(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "[reconciler]\ninterval_s = 0.5\npartitions_in_flight_max = 2\n"
        "[housekeeper]\nidle_after_s = 1.0\nretention_s = 3600.0\nretention_bytes = 1048576\n"
        "[gc]\ngrace_s = 0.0\nworker_index = 1\nworker_count = 4\nenabled = false\n",
    )
    node = load_config(path, environ={"LEVELZERO_GC_INTERVAL_S": "2"}).node_config()
    assert (node.reconciler.interval_s, node.reconciler.partitions_in_flight_max) == (0.5, 2)
    assert (node.housekeeper.idle_after_s, node.housekeeper.retention_s) == (1.0, 3600.0)
    assert node.housekeeper.retention_bytes == 1048576
    assert (node.gc.grace_s, node.gc.interval_s, node.gc.enabled) == (0.0, 2.0, False)
    assert node.gc.prefixes == range(250, 500)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[gc]\ngrace_s = -1.0\n", r"gc: grace_s must be >= 0 \(got -1\.0\)"),
        (
            "[gc]\ninterval_s = 10.0\nidle_backoff_max_s = 5.0\n",
            r"gc: idle_backoff_max_s \(5\.0\) must be >= interval_s",
        ),
        ("[gc]\nworker_index = 2\nworker_count = 2\n", r"gc: worker_index must be in 0\.\.1 \(got 2\)"),
        ("[gc]\ndelete_batch_keys_max = 5000\n", r"gc: delete_batch_keys_max must be in 1\.\.1000"),
        ("[gc]\ngrace = 1.0\n", r"gc\.grace: unknown key"),
        ("[gc]\nenabled = 'yes'\n", r"gc\.enabled: Expected bool, got str"),
        ("[reconciler]\ninterval_s = 0.0\n", r"reconciler: interval_s and copy_deadline_s must be > 0"),
        (
            "[reconciler]\nobject_bytes_max = 10\n",
            r"reconciler: object_bytes_max must be in 1 KiB\.\.256 MiB",
        ),
        ("[node]\nl0_cache_bytes_max = -1\n", r"node: l0_cache_bytes_max must be in 0\.\.64 GiB"),
        ("[housekeeper]\nretention_s = -5.0\n", r"housekeeper: retention_s must be >= 0 \(0 turns it off\)"),
        ("[housekeeper]\nretention_bytes = -1\n", r"housekeeper: retention_bytes must be >= 0"),
        (
            "[housekeeper]\nidle_after_s = -1.0\n",
            r"housekeeper: interval_s must be > 0 and idle_after_s >= 0",
        ),
    ],
)
def test_actor_sections_are_checked_by_the_actors_rules(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, text), environ={})


def test_actor_section_errors_from_the_environment_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"LEVELZERO_GC_GRACE_S \(gc\.grace_s\) = 'soon'"):
        load_config(None, environ={"LEVELZERO_GC_GRACE_S": "soon"})
    with pytest.raises(ConfigError, match=r"gc: worker_count must be in 1\.\.1000 \(got 0\)"):
        load_config(None, environ={"LEVELZERO_GC_WORKER_COUNT": "0"})


def test_unknown_key_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nlisten = '127.0.0.1:1'\nlisten_adress = 'x'\n")
    with pytest.raises(ConfigError, match=r"server\.listen_adress: unknown key"):
        load_config(path, environ={})


def test_unknown_section_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"serverr: unknown key"):
        load_config(write(tmp_path, "[serverr]\nlisten = 'x'\n"), environ={})


def test_wrong_type_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[batcher]\nlinger_ms = 'soon'\n")
    with pytest.raises(ConfigError, match=r"batcher\.linger_ms: Expected float, got str"):
        load_config(path, environ={})


def test_bad_enum_value_is_named(tmp_path: Path) -> None:
    path = write(tmp_path, "[node]\nfencing_mode = 'loose'\n")
    with pytest.raises(ConfigError, match=r"node\.fencing_mode: Invalid enum value 'loose'"):
        load_config(path, environ={})


def test_out_of_range_value_names_section_and_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server: records_per_request_max must be in"):
        load_config(write(tmp_path, "[server]\nrecords_per_request_max = 0\n"), environ={})
    with pytest.raises(ConfigError, match=r"batcher: need 1024 <= batch_bytes_max"):
        load_config(write(tmp_path, "[batcher]\nbatch_bytes_max = 10\n"), environ={})
    # A window no produce outlasts a client's request timeout in (every produce waited for it).
    for key in ("linger_ms", "transaction_linger_ms"):
        with pytest.raises(ConfigError, match=rf"batcher: {key} must be at most 10000 \(a produce waits"):
            load_config(write(tmp_path, f"[batcher]\n{key} = 1e9\n"), environ={})
        at_most = load_config(write(tmp_path, f"[batcher]\n{key} = 10000\n"), environ={})
        assert getattr(at_most.batcher, key) == 10000


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LEVELZERO_BATCHER_LINGER_MS", "nan"),
        ("LEVELZERO_HOUSEKEEPER_RETENTION_S", "nan"),
        ("LEVELZERO_RECONCILER_INTERVAL_S", "inf"),
        ("LEVELZERO_S3_READ_TIMEOUT_S", "inf"),
    ],
)
def test_a_number_that_is_not_finite_is_refused_naming_the_key(variable: str, value: str) -> None:
    """NaN passes a range check (every comparison with it is false): `housekeeper.retention_s =
    nan` crashed the daemon at start-up with a traceback, `batcher.linger_ms = nan` left every
    produce unanswered. Refused as every bad value is, naming the key."""
    section, key = variable.removeprefix("LEVELZERO_").lower().split("_", 1)
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: must be a finite number, not {value}"):
        load_config(None, environ={variable: value})


def test_the_epoch_timer_is_off_or_at_least_a_tenth_of_a_second() -> None:
    """A microsecond timer was accepted: 1,500 cluster-epoch bumps a second, each a control-plane
    write and a log line."""
    for value in ("0.0000001", "0.05", "86401"):
        with pytest.raises(ConfigError, match=r"epoch_bump_interval_s must be 0 \(the timer off\) or in 0.1"):
            load_config(None, environ={"LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": value})
    for value, expected in (("0", None), ("0.1", 0.1), ("60", 60.0)):
        config = load_config(None, environ={"LEVELZERO_NODE_EPOCH_BUMP_INTERVAL_S": value})
        assert config.node_config().epoch_bump_interval_s == expected


def test_invalid_toml_and_missing_file_are_reported(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load_config(write(tmp_path, "[server\n"), environ={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(str(tmp_path / "nope.toml"), environ={})


def test_environment_overrides_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[storage]\ndata_dir = '/from/file'\n[batcher]\nlinger_ms = 10.0\n")
    config = load_config(
        path,
        environ={
            "LEVELZERO_DATA_DIR": "/from/env",
            "LEVELZERO_BATCHER_LINGER_MS": "20",
            "LEVELZERO_S3_PATH_STYLE": "true",
            "PATH": "/usr/bin",
        },
    )
    assert config.storage.data_dir == "/from/env"
    assert config.batcher.linger_ms == 20.0
    assert config.s3.path_style is True


def test_long_environment_name_wins_over_alias() -> None:
    config = load_config(
        None, environ={"LEVELZERO_LISTEN": "127.0.0.1:1", "LEVELZERO_SERVER_LISTEN": "127.0.0.1:2"}
    )
    assert config.server.listen == "127.0.0.1:2"


def test_flags_override_environment_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nlisten = '127.0.0.1:1'\n[storage]\ndata_dir = '/file'\n")
    config = load_config(
        path,
        environ={"LEVELZERO_LISTEN": "127.0.0.1:2", "LEVELZERO_DATA_DIR": "/env"},
        overrides={("server", "listen"): "127.0.0.1:3", ("storage", "data_dir"): "/flag"},
    )
    assert config.server.listen == "127.0.0.1:3"
    assert config.storage.data_dir == "/flag"


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LEVELZERO_LISTEN", "foo", r"server: listen must be HOST:PORT .*not 'foo'"),
        ("LEVELZERO_BATCHER_LINGER_MS", "-5", r"batcher: linger_ms .*must be >= 0"),
        ("LEVELZERO_S3_ENDPOINT", "127.0.0.1:5055", r"s3: endpoint must be an http:// or https:// URL"),
    ],
)
def test_an_invalid_value_is_blamed_on_the_variable_it_came_from_not_the_file(
    tmp_path: Path, variable: str, value: str, message: str
) -> None:
    path = write(tmp_path, "[server]\nlisten = '127.0.0.1:1'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={variable: value})
    assert str(caught.value).startswith(f"invalid configuration (environment variable {variable}): ")
    assert path not in str(caught.value)
    assert re.search(message, str(caught.value))


def test_an_invalid_value_is_blamed_on_the_flag_it_came_from(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nlisten = '127.0.0.1:1'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(
            path,
            environ={"LEVELZERO_LISTEN": "127.0.0.1:2"},
            overrides={("server", "listen"): "bar"},
            override_names={("server", "listen"): "--listen"},
        )
    assert str(caught.value) == (
        "invalid configuration (flag --listen): server: listen must be HOST:PORT "
        "(e.g. 127.0.0.1:8420), not 'bar'"
    )
    # A value whose check fails only with another source's: the one that, taken away, clears it.
    with pytest.raises(ConfigError, match=r"^invalid configuration \(flag --listen\): server: token is"):
        load_config(
            None,
            environ={"LEVELZERO_DATA_DIR": "/env"},
            overrides={("server", "listen"): "0.0.0.0:1"},
            override_names={("server", "listen"): "--listen"},
        )
    # An override without a flag's name is named by its key.
    with pytest.raises(ConfigError, match=r"^invalid configuration \(override of server\.listen\): "):
        load_config(None, environ={}, overrides={("server", "listen"): "0.0.0.0:1"})


def test_an_invalid_value_in_the_file_is_still_blamed_on_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nlisten = 'bar'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={"LEVELZERO_TOKEN": "t" * 20, "LEVELZERO_BATCHER_LINGER_MS": "5"})
    assert str(caught.value).startswith(f"invalid configuration ({path}): server: listen must be")


def test_an_error_of_the_file_is_not_blamed_on_a_pair_of_variables_not_in_it(tmp_path: Path) -> None:
    """The documented S3 credentials in the environment, a typo in the file: the error was
    blamed on both variables (taking one away makes an error of its own, the pair's)."""
    path = write(tmp_path, "[storage]\nkind = 's3'\n[s3]\nbucket = 'b'\n[cluster]\nlease_ttl = 10\n")
    environ = {"LEVELZERO_S3_ACCESS_KEY": "key", "LEVELZERO_S3_SECRET_KEY": "secret"}
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ=environ)
    assert str(caught.value).startswith(f"invalid configuration ({path}): ")
    assert "LEVELZERO_S3" not in str(caught.value)
    # A bad variable over a bad file value is still the variable's.
    path = write(tmp_path, "[server]\nlisten = 'bar'\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, environ={**environ, "LEVELZERO_LISTEN": "foo"})
    assert str(caught.value).startswith("invalid configuration (environment variable LEVELZERO_LISTEN): ")


def test_bad_environment_value_names_the_variable() -> None:
    with pytest.raises(
        ConfigError, match=r"LEVELZERO_SERVER_BODY_BYTES_MAX \(server\.body_bytes_max\) = 'lots'"
    ):
        load_config(None, environ={"LEVELZERO_SERVER_BODY_BYTES_MAX": "lots"})


def test_unknown_environment_setting_is_refused_but_client_variables_are_not() -> None:
    with pytest.raises(ConfigError, match="LEVELZERO_S3_BUKET is not a levelzero setting"):
        load_config(None, environ={"LEVELZERO_S3_BUKET": "b"})
    load_config(None, environ={"LEVELZERO_URL": "http://x", "LEVELZERO_TEST_S3_ENDPOINT": "y"})


def test_non_loopback_listen_requires_a_token() -> None:
    with pytest.raises(ConfigError, match=r"token is required when listen \(0\.0\.0\.0:8420\)"):
        load_config(None, environ={"LEVELZERO_LISTEN": "0.0.0.0:8420"})
    with pytest.raises(ConfigError, match="token must be at least 16 characters"):
        load_config(None, environ={"LEVELZERO_LISTEN": "0.0.0.0:8420", "LEVELZERO_TOKEN": "short"})
    config = load_config(None, environ={"LEVELZERO_LISTEN": "0.0.0.0:8420", "LEVELZERO_TOKEN": "x" * 16})
    assert config.server.token == "x" * 16
    for loopback in ("127.0.0.1:1", "[::1]:1", "localhost:1"):
        assert load_config(None, environ={"LEVELZERO_LISTEN": loopback}).server.token == ""


def test_tokens_are_printable_ascii_everywhere(tmp_path: Path, capsys, monkeypatch) -> None:
    for bad in ("pässwörd-0123456789", "with space 0123456789", "tab\there-0123456789", "\x7f" * 16):
        with pytest.raises(ConfigError, match="a token is printable ASCII without spaces") as caught:
            load_config(None, environ={"LEVELZERO_TOKEN": bad})
        assert bad not in str(caught.value)  # a secret is never echoed
        assert main(["status", "--url", "http://127.0.0.1:9", "--token", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("levelzero: --token (or $LEVELZERO_TOKEN): token character")
        assert "Traceback" not in err and bad not in err
    monkeypatch.setenv("LEVELZERO_TOKEN", "pässwörd-0123456789")
    assert main(["topics", "list", "--url", "http://127.0.0.1:9"]) == 2
    assert "printable ASCII" in capsys.readouterr().err
    assert main(["run", "--data-dir", str(tmp_path)]) == 2
    assert "server: token character 2 is not allowed" in capsys.readouterr().err
    token = "".join(chr(c) for c in range(ord("!"), ord("~") + 1))  # every allowed character
    assert load_config(None, environ={"LEVELZERO_TOKEN": token}).server.token == token


def test_listen_parsing() -> None:
    assert parse_listen("127.0.0.1:80") == ("127.0.0.1", 80)
    assert parse_listen("[::1]:8420") == ("::1", 8420)
    for bad in ("8420", "host:", ":80", "::1:80", "h:99999", "h:-1"):
        with pytest.raises(ValueError, match="listen"):
            parse_listen(bad)


def test_s3_requires_a_bucket_and_paired_credentials() -> None:
    with pytest.raises(ConfigError, match="s3.bucket is required"):
        load_config(None, environ={"LEVELZERO_STORAGE_KIND": "s3"})
    with pytest.raises(ConfigError, match="access_key and secret_key must be given together"):
        load_config(None, environ={"LEVELZERO_S3_ACCESS_KEY": "a"})
    config = load_config(
        None,
        environ={
            "LEVELZERO_STORAGE_KIND": "s3",
            "LEVELZERO_S3_BUCKET": "b",
            "LEVELZERO_S3_ENDPOINT": "http://127.0.0.1:9000",
            "LEVELZERO_S3_PATH_STYLE": "1",
            "LEVELZERO_S3_ACCESS_KEY": "minioadmin",
            "LEVELZERO_S3_SECRET_KEY": "secret-value",
        },
    )
    assert (config.s3.bucket, config.s3.endpoint, config.s3.path_style) == (
        "b",
        "http://127.0.0.1:9000",
        True,
    )


def test_secrets_are_masked_when_described() -> None:
    config = load_config(
        None,
        environ={
            "LEVELZERO_TOKEN": "t" * 20,
            "LEVELZERO_S3_ACCESS_KEY": "AKIAEXAMPLE",
            "LEVELZERO_S3_SECRET_KEY": "very-secret",
        },
    )
    described = json.dumps(describe(config))
    assert "t" * 20 not in described and "AKIAEXAMPLE" not in described and "very-secret" not in described
    assert describe(config)["server"]["token"] == "***"
    assert describe(config)["s3"]["session_token"] == ""


def test_secret_in_a_bad_environment_value_is_not_echoed() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, environ={"LEVELZERO_SERVER_TOKEN": "x" * 8, "LEVELZERO_LISTEN": "0.0.0.0:1"})
    assert "x" * 8 not in str(caught.value)


def test_config_show_prints_effective_configuration(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("LEVELZERO_CONFIG", raising=False)
    monkeypatch.setenv("LEVELZERO_TOKEN", "secret-token-123456")
    assert main(["config", "show", "--data-dir", str(tmp_path), "--listen", "127.0.0.1:9"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["storage"]["data_dir"] == str(tmp_path)
    assert shown["server"]["listen"] == "127.0.0.1:9"
    assert shown["server"]["token"] == "***"


def test_run_with_bad_configuration_exits_2_naming_the_key(tmp_path: Path, capsys) -> None:
    path = write(tmp_path, "[server]\nbogus = 1\n")
    assert main(["run", "--config", path]) == 2
    assert "server.bogus: unknown key" in capsys.readouterr().err


def test_run_refuses_a_non_loopback_listen_without_token(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("LEVELZERO_TOKEN", raising=False)
    monkeypatch.delenv("LEVELZERO_SERVER_TOKEN", raising=False)
    assert main(["run", "--data-dir", str(tmp_path), "--listen", "0.0.0.0:0"]) == 2
    assert "token is required" in capsys.readouterr().err


def test_daemon_refuses_to_run_without_assertions(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-O", "-m", "levelzero.cli", "run", "--data-dir", str(tmp_path)],
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert b"refusing to run with assertions disabled" in result.stderr
    assert not (tmp_path / "levelzero.db").exists()


# ---------------------------------------------------------------------------------- logs


def _record(msg: str, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("levelzero.test", logging.WARNING, __file__, 1, msg, None, None)
    record.__dict__.update(extra)
    return record


def test_key_value_lines_carry_extras_and_stay_one_line() -> None:
    line = KeyValueFormatter().format(_record("two\nlines", epoch=7, where="a b"))
    assert "\n" not in line
    assert " level=warning logger=levelzero.test " in line
    assert 'msg="two\\nlines"' in line
    assert "epoch=7" in line and 'where="a b"' in line


def test_exceptions_stay_on_the_event_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    line = KeyValueFormatter().format(record)
    assert "\n" not in line and "ValueError: boom" in line
    parsed = json.loads(JsonFormatter().format(record))
    assert parsed["msg"] == "failed" and "ValueError: boom" in parsed["exc"]


def test_json_lines_parse() -> None:
    parsed = json.loads(JsonFormatter().format(_record("hello", partitions=3)))
    assert parsed["msg"] == "hello" and parsed["partitions"] == 3 and parsed["level"] == "warning"


def test_configure_logging_replaces_handlers() -> None:
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        first, second = io.StringIO(), io.StringIO()
        configure_logging("info", "kv", stream=first)
        configure_logging("info", "json", stream=second)
        logging.getLogger("levelzero.test").info("after", extra={"n": 1})
        assert first.getvalue() == ""
        assert json.loads(second.getvalue())["n"] == 1
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)


def test_a_library_warning_about_a_failure_it_retries_is_one_line_without_its_traceback() -> None:
    # asyncpg's pool, re-connecting while PostgreSQL is down: its warning carried ~1.8 KB of
    # traceback a line; the error's one line says what it did.
    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        out = io.StringIO()
        configure_logging("info", "kv", stream=out)
        configure_logging("info", "kv", stream=out)  # again (SIGHUP): one filter still
        pool = logging.getLogger("asyncpg.pool")
        try:
            raise ConnectionRefusedError(111, "Connect call failed")
        except ConnectionRefusedError:
            pool.warning("Failed to restore the pool connection floor; retrying", exc_info=True)
            logging.getLogger("levelzero.test").warning("ours keeps it", exc_info=True)
        first, second = out.getvalue().splitlines()
        assert "Traceback" not in first and "exc=" not in first
        assert 'error="ConnectionRefusedError: [Errno 111] Connect call failed"' in first
        assert "exc=" in second  # levelzero's own loggers are not touched
        assert len(pool.filters) == 1
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved_handlers:
            root.addHandler(handler)
        root.setLevel(saved_level)


def test_cluster_settings_are_checked() -> None:
    pg = {"LEVELZERO_CONTROL_KIND": "postgres", "LEVELZERO_CONTROL_DSN": "postgresql://u@127.0.0.1/db"}
    on = {"LEVELZERO_CLUSTER_ENABLED": "true", "LEVELZERO_CLUSTER_ADVERTISE_URL": "http://10.0.0.5:7070"}
    config = load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_NODE_ID": "n1"})
    assert (config.cluster.enabled, config.cluster.node_id, config.cluster.lease_ttl_s) == (True, "n1", 10.0)
    with pytest.raises(ConfigError, match="cluster.enabled needs the PostgreSQL control plane"):
        load_config(None, environ=on)
    with pytest.raises(ConfigError, match="cluster.advertise_url is required"):
        load_config(None, environ={**pg, "LEVELZERO_CLUSTER_ENABLED": "true"})
    with pytest.raises(ConfigError, match="must be an http\\(s\\) URL of this node"):
        load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_ADVERTISE_URL": "10.0.0.5:7070"})
    with pytest.raises(ConfigError, match="lease_ttl_s must be in 1..300"):
        load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_LEASE_TTL_S": "0.1"})
    with pytest.raises(ConfigError, match="node_id must be"):
        load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_NODE_ID": "has space"})
    assert config.cluster.forget_expired_after_s == 3600.0
    kept = load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_FORGET_EXPIRED_AFTER_S": "600"})
    assert kept.cluster.forget_expired_after_s == 600.0
    with pytest.raises(ConfigError, match="forget_expired_after_s must be in 60..31536000"):
        load_config(None, environ={**pg, **on, "LEVELZERO_CLUSTER_FORGET_EXPIRED_AFTER_S": "5"})


def test_the_keepalive_timeout_takes_a_fraction_of_a_second_like_the_other_timeouts(tmp_path: Path) -> None:
    from_file = load_config(write(tmp_path, "[server]\nkeepalive_timeout_s = 0.5\n"), environ={})
    assert from_file.server.keepalive_timeout_s == 0.5
    from_env = load_config(None, environ={"LEVELZERO_SERVER_KEEPALIVE_TIMEOUT_S": "2.5"})
    assert from_env.server.keepalive_timeout_s == 2.5
    with pytest.raises(ConfigError, match=r"keepalive_timeout_s must be in 0\.1\.\.3600"):
        load_config(None, environ={"LEVELZERO_SERVER_KEEPALIVE_TIMEOUT_S": "0.05"})


def test_the_gc_section_defaults_are_the_gc_actors() -> None:
    """`[gc]`'s defaults are read from `GcConfig`, not written a second time."""

    assert msgspec.structs.asdict(GcSection()) == dataclasses.asdict(GcConfig())
    assert load_config(None, environ={}).gc.to_gc_config() == GcConfig()


def test_the_configuration_reference_documents_every_key() -> None:
    """Every key `levelzero config show` prints has a row in docs/configuration.md, so the
    reference cannot fall behind the configuration structs."""
    reference = (REPO / "docs" / "configuration.md").read_text()
    missing = [
        f"{section}.{key}"
        for section, keys in describe(Config()).items()
        for key in keys
        if f"`{section}.{key}`" not in reference
    ]
    assert not missing, f"docs/configuration.md does not document {missing}"


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"LEVELZERO_METRICS_LISTEN": "127.0.0.1:8420"},
            "metrics.listen (127.0.0.1:8420) and server.listen (127.0.0.1:8420) take the same address",
        ),
        (
            {"LEVELZERO_KAFKA_LISTEN": "127.0.0.1:9092", "LEVELZERO_METRICS_LISTEN": "127.0.0.1:9092"},
            "metrics.listen (127.0.0.1:9092) and kafka.listen (127.0.0.1:9092) take the same address",
        ),
        (  # the wildcard address takes the port on every address
            {"LEVELZERO_KAFKA_LISTEN": "0.0.0.0:8420", "LEVELZERO_TOKEN": "x" * 20},
            "kafka.listen (0.0.0.0:8420) and server.listen (127.0.0.1:8420) take the same address",
        ),
    ],
)
def test_two_listeners_on_one_address_are_refused_when_the_configuration_is_checked(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(None, environ=environ)


def test_listeners_on_other_ports_or_on_free_ports_are_apart() -> None:
    load_config(None, environ={"LEVELZERO_METRICS_LISTEN": "127.0.0.1:9100"})
    load_config(None, environ={"LEVELZERO_METRICS_LISTEN": "127.0.0.2:8420"})
    both_free = {"LEVELZERO_LISTEN": "127.0.0.1:0", "LEVELZERO_KAFKA_LISTEN": "127.0.0.1:0"}
    load_config(None, environ={**both_free, "LEVELZERO_METRICS_LISTEN": "127.0.0.1:0"})


def test_metrics_listen_equal_to_the_listen_flag_exits_2_naming_both_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LEVELZERO_CONFIG", raising=False)
    path = write(tmp_path, "[metrics]\nlisten = '127.0.0.1:5055'\n")
    assert main(["config", "show", "--config", path, "--listen", "127.0.0.1:5055"]) == 2
    err = capsys.readouterr().err
    assert "metrics.listen (127.0.0.1:5055) and server.listen (127.0.0.1:5055)" in err
    assert "give metrics.listen another port" in err


def test_secrets_in_a_file_others_may_read_are_warned_of(tmp_path: Path) -> None:
    """server.token and S3 keys are taken from the TOML file (control.password is refused
    there), which the install writes as 0644: said at start, with where they belong."""
    toml = tmp_path / "levelzero.toml"
    toml.write_text('[server]\ntoken = "t0ken-long-enough-for-the-rules"\n[s3]\nsecret_key = "k"\n')
    toml.chmod(0o644)
    warning = secrets_readable_by_others(str(toml))
    assert warning == (
        f"{toml} holds s3.secret_key and server.token and other users may read it (mode 0644): give "
        "them in the environment instead (LEVELZERO_S3_SECRET_KEY, LEVELZERO_SERVER_TOKEN, e.g. in "
        f"the unit's environment file, mode 0600), or chmod 600 {toml}"
    )
    toml.chmod(0o600)
    assert secrets_readable_by_others(str(toml)) is None
    toml.write_text('[storage]\ndata_dir = "/var/lib/levelzero"\n')
    toml.chmod(0o644)
    assert secrets_readable_by_others(str(toml)) is None
