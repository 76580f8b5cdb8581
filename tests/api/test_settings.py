"""The API's settings: key parsing, the generated local key, and `stepwise api` refusing bad settings."""

from __future__ import annotations

import stat
import subprocess
import sys

import pytest

from api.auth import KeyRing
from api.settings import DEFAULT_TENANT, ApiSettings, SettingsError, local_dev_key, parse_api_keys
from tests.support.servers import child_env


def test_api_keys_are_tenant_key_pairs_and_a_tenant_may_hold_several():
    pairs = parse_api_keys(" acme:k1 , acme:k2,globex:k:with:colons ")
    ring = KeyRing(pairs)

    assert pairs == (("acme", "k1"), ("acme", "k2"), ("globex", "k:with:colons"))
    assert [ring.tenant_for(key) for key in ("k1", "k2", "k:with:colons", "k3", "")] == [
        "acme",
        "acme",
        "globex",
        None,
        None,
    ]


@pytest.mark.parametrize("text", ["acme", "acme:", ":key", ",", "acme:k\x7f"])
def test_malformed_api_keys_are_refused(text):
    with pytest.raises(SettingsError):
        parse_api_keys(text)


def test_without_api_keys_one_local_key_is_generated_once_and_kept_private(tmp_path, monkeypatch):
    monkeypatch.delenv("STEPWISE_API_KEYS", raising=False)
    monkeypatch.setenv("STEPWISE_VAR_DIR", str(tmp_path / "var"))

    first = ApiSettings.from_env().api_keys
    second = ApiSettings.from_env().api_keys

    assert first == second and first[0][0] == DEFAULT_TENANT and len(first[0][1]) >= 24
    key_file = tmp_path / "var" / "api-key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert local_dev_key(key_file) == first[0][1]


def test_stepwise_api_refuses_malformed_settings_before_serving(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "stepwise_cli.main", "api", "--port", "1"],
        env=child_env(STEPWISE_API_KEYS="no-colon-here", STEPWISE_VAR_DIR=str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 2
    assert "STEPWISE_API_KEYS" in result.stderr
