"""Which Redis a process finds (storage.redis_location), and Redis URLs as STEPWISE_REDIS_URL takes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from settings import SettingsError, read
from storage.redis_location import RedisLocation, find_redis
from storage.settings import StorageSettings


def save_state(var_dir, redis_url: str, pid: int) -> None:
    var_dir.mkdir(parents=True, exist_ok=True)
    (var_dir / "stepwise.json").write_text(
        json.dumps({"api_url": "http://127.0.0.1:1", "redis_url": redis_url, "pid": pid})
    )


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def found() -> RedisLocation:
    """What a process started now finds (StorageSettings.from_env reads the variables)."""
    settings = StorageSettings.from_env()
    return RedisLocation(settings.redis_url, settings.redis_source)


@pytest.fixture
def var_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPWISE_REDIS_URL", raising=False)
    monkeypatch.delenv("STEPWISE_REDIS_SENTINEL_MASTER", raising=False)
    monkeypatch.setenv("STEPWISE_VAR_DIR", str(tmp_path / "var"))
    return tmp_path / "var"


def test_a_running_ups_saved_redis_is_found_when_the_environment_names_none(var_dir):
    save_state(var_dir, "redis://127.0.0.1:6390/0", os.getpid())  # this process stands in for a running `up`

    location = found()

    assert location.url == "redis://127.0.0.1:6390/0" and "saved by `stepwise up`" in location.source
    assert find_redis(None, var_dir) == location


def test_the_environment_wins_over_a_running_ups_file(var_dir, monkeypatch):
    save_state(var_dir, "redis://127.0.0.1:6390/0", os.getpid())
    monkeypatch.setenv("STEPWISE_REDIS_URL", "redis://127.0.0.1:6391/2")

    assert found().url == "redis://127.0.0.1:6391/2" and found().source == "STEPWISE_REDIS_URL"


def test_without_a_state_file_the_default_is_used(var_dir):
    assert found().url == "redis://127.0.0.1:6379/0" and found().source == "the default"


@pytest.mark.parametrize("content", ["stopped", "no pid", "not json"])
def test_a_stopped_ups_file_or_a_broken_one_stops_the_process_naming_it_instead_of_trying_the_default(var_dir, content):
    if content == "stopped":
        pid = dead_pid()
        save_state(var_dir, "redis://:pw@127.0.0.1:6390/0", pid)
        named = f"Redis redis://:***@127.0.0.1:6390/0 of the `stepwise up` with pid {pid}"
    elif content == "no pid":  # written by an `up` before pids were saved: nothing says it still runs
        var_dir.mkdir(parents=True)
        (var_dir / "stepwise.json").write_text(json.dumps({"redis_url": "redis://127.0.0.1:6390/0"}))
        named = "Redis redis://127.0.0.1:6390/0 of the `stepwise up` with pid None"
    else:
        var_dir.mkdir(parents=True)
        (var_dir / "stepwise.json").write_text("{")
        named = "a Redis it cannot tell (JSONDecodeError"

    with pytest.raises(SettingsError) as refused:
        found()

    said = str(refused.value)
    assert str(var_dir / "stepwise.json") in said and named in said and "which is not running" in said
    assert "6379" not in said and ":pw@" not in said


def test_a_password_is_never_shown_where_the_location_is_described(var_dir, monkeypatch):
    monkeypatch.setenv("STEPWISE_REDIS_URL", "rediss://:s3cret@cache.example.com:6380/0")

    described = found().describe()

    assert "s3cret" not in described and described.startswith("rediss://:***@cache.example.com:6380/0")


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("rediss://:pw@cache:6380/0", "rediss://:pw@cache:6380/0?ssl_cert_reqs=required"),  # checked unless told
        ("rediss://cache:6380/0?ssl_cert_reqs=CERT_NONE", "rediss://cache:6380/0?ssl_cert_reqs=none"),  # Celery's word
        ("rediss://cache:6380/0?ssl_cert_reqs=Optional", "rediss://cache:6380/0?ssl_cert_reqs=optional"),
    ],
)
def test_rediss_urls_are_spelled_so_redis_py_and_celery_both_take_them(monkeypatch, given, used):
    monkeypatch.setenv("STEPWISE_REDIS_URL", given)

    assert read("STEPWISE_REDIS_URL") == used


def test_tls_files_in_a_rediss_url_are_kept_and_must_exist(monkeypatch, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setenv("STEPWISE_REDIS_URL", f"rediss://cache:6380/0?ssl_ca_certs={ca}&ssl_certfile={ca}")
    assert (
        read("STEPWISE_REDIS_URL")
        == f"rediss://cache:6380/0?ssl_ca_certs={ca}&ssl_certfile={ca}&ssl_cert_reqs=required"
    )

    monkeypatch.setenv("STEPWISE_REDIS_URL", f"rediss://cache:6380/0?ssl_keyfile={tmp_path / 'missing.key'}")
    with pytest.raises(SettingsError, match="STEPWISE_REDIS_URL: ssl_keyfile names no readable file"):
        read("STEPWISE_REDIS_URL")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("redis://cache:6379/0?ssl_cert_reqs=required", "TLS needs a rediss:// URL"),
        ("rediss://cache:6380/0?ssl_cert_reqs=sometimes", "ssl_cert_reqs must be required, optional or none"),
        ("http://cache:6379/0", "must be a URL: redis://, rediss://, unix://, sentinel:// or sentinels://"),
    ],
)
def test_a_redis_url_redis_py_or_celery_would_misread_is_refused_naming_the_variable(monkeypatch, given, message):
    monkeypatch.setenv("STEPWISE_REDIS_URL", given)

    with pytest.raises(SettingsError, match=f"STEPWISE_REDIS_URL.*{message}"):
        read("STEPWISE_REDIS_URL")


SENTINELS = "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380;sentinel://10.0.0.3"


@pytest.mark.parametrize(
    ("given", "used"),
    [
        (f"{SENTINELS}/2", "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380;sentinel://10.0.0.3:26379/2"),
        (SENTINELS, "sentinel://10.0.0.1:26379;sentinel://10.0.0.2:26380;sentinel://10.0.0.3:26379/0"),
        ("sentinel://:pw@h1:1;sentinel://:pw@h2:2/1", "sentinel://:pw@h1:1;sentinel://h2:2/1"),  # the master's
    ],
)
def test_celerys_sentinel_form_is_taken_with_its_default_port_and_database(monkeypatch, given, used):
    monkeypatch.setenv("STEPWISE_REDIS_URL", given)

    assert read("STEPWISE_REDIS_URL") == used


def test_the_master_named_apart_is_folded_into_the_url_every_process_and_up_pass_on(var_dir, monkeypatch):
    monkeypatch.setenv("STEPWISE_REDIS_URL", f"{SENTINELS}/0")
    monkeypatch.setenv("STEPWISE_REDIS_SENTINEL_MASTER", "mymaster")

    location = found()

    assert location.url.endswith("/0?master_name=mymaster")
    save_state(var_dir, location.url, os.getpid())  # what a `stepwise up` started with it saves
    monkeypatch.delenv("STEPWISE_REDIS_URL")
    monkeypatch.delenv("STEPWISE_REDIS_SENTINEL_MASTER")
    assert found().url == location.url


@pytest.mark.parametrize(
    ("url", "master", "message"),
    [
        (SENTINELS, None, "STEPWISE_REDIS_SENTINEL_MASTER must name the master"),
        (f"{SENTINELS}/0?master_name=a", "b", r"STEPWISE_REDIS_SENTINEL_MASTER \('b'\) and the URL's master_name"),
        ("redis://cache:6379/0", "mymaster", "the Redis URL is not a sentinel:// URL"),
    ],
)
def test_a_sentinel_master_missing_or_contradicted_is_refused_naming_the_variable(
    var_dir, monkeypatch, url, master, message
):
    monkeypatch.setenv("STEPWISE_REDIS_URL", url)
    if master:
        monkeypatch.setenv("STEPWISE_REDIS_SENTINEL_MASTER", master)

    with pytest.raises(SettingsError, match=message):
        found()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("sentinel://h1:26379;redis://h2:6379/0", "each part of a Sentinel URL is sentinel://host:port"),
        ("sentinel://h1:26379/1;sentinel://h2:26379/2", "its parts name two databases"),
        ("sentinel://h1:26379;sentinels://h2:26379", "its parts name two schemes"),
        ("sentinel://h1:26379/0?ssl_cert_reqs=none", "TLS needs a sentinels:// URL"),
        ("sentinel://h1:26379/0?socket_timeout=3", "a Sentinel URL takes master_name, sentinel_password"),
        ("sentinel://h1:port/0", "has no valid port"),
    ],
)
def test_a_sentinel_url_no_client_could_use_is_refused_naming_the_variable(monkeypatch, given, message):
    monkeypatch.setenv("STEPWISE_REDIS_URL", given)

    with pytest.raises(SettingsError, match=f"STEPWISE_REDIS_URL.*{message}"):
        read("STEPWISE_REDIS_URL")


def test_a_sentinel_urls_passwords_are_never_shown(var_dir, monkeypatch, tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    url = f"sentinels://:m4ster@h1:26379;sentinels://h2:26379/0?sentinel_password=s3nt&ssl_ca_certs={ca}"
    monkeypatch.setenv("STEPWISE_REDIS_URL", url)
    monkeypatch.setenv("STEPWISE_REDIS_SENTINEL_MASTER", "mymaster")

    described = found().describe()

    assert "m4ster" not in described and "s3nt" not in described
    assert described.startswith("sentinels://:***@h1:26379;sentinels://h2:26379/0?master_name=mymaster")
    assert "sentinel_password=***" in described and "ssl_cert_reqs=required" in described  # TLS checked by default
