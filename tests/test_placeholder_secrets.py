"""One rule for every secret (issue 48 E4): a placeholder in any common spelling is refused when a process starts,
naming the variable and never echoing the value. `change-me` was refused in API keys and the webhook secret, but
`changeme`, `CHANGEME`, `change_me`, `replace-me` ... were accepted as API keys, and the placeholder Redis URL and
S3 keys that deploy/kubernetes/secret.yaml says are refused started fine.

The processes' own start-up readers are called (`ApiSettings.from_env`, `WorkerSettings.from_env`: what `stepwise
api` and `stepwise worker` call first); tests/test_compose.py runs `stepwise api` itself on one such value.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from api.settings import ApiSettings
from settings import SettingsError
from settings.placeholders import is_placeholder
from worker.settings import WorkerSettings

SECRET_YAML = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "secret.yaml"
SPELLINGS = [
    "change-me",
    "changeme",
    "CHANGEME",
    "change_me",
    "Change.Me",
    "change me",
    "ChangeMe123",
    "replace-me",
    "REPLACE_ME",
    "replaceme",
    "change-this",
    "replace_this",
    "fill-me-in",
    "PLACEHOLDER",
    "my-placeholder-key",
]
# variable -> how a value holding `word` is written there
SECRETS = {
    "STEPWISE_API_KEYS": lambda word: f"team-a:sk_real_one,team-b:{word}",
    "STEPWISE_ADMIN_API_KEYS": lambda word: f"ops:{word}",
    "STEPWISE_WEBHOOK_SECRET": lambda word: "whsec_" + base64.b64encode(word.encode()).decode(),
    "STEPWISE_REDIS_URL": lambda word: f"redis://:{word}@127.0.0.1:6390/0",
    "AWS_ACCESS_KEY_ID": lambda word: word,
    "AWS_SECRET_ACCESS_KEY": lambda word: f"{word}-s3",
}
READERS = {"api": ApiSettings.from_env, "worker": WorkerSettings.from_env}
API_ONLY = {"STEPWISE_API_KEYS", "STEPWISE_ADMIN_API_KEYS"}  # the rest both processes read


def readers_of(name: str) -> list[str]:
    return ["api"] if name in API_ONLY else list(READERS)


@pytest.fixture
def env(monkeypatch, tmp_path):
    """A valid environment both processes start from; each test then sets one secret."""
    monkeypatch.setenv("STEPWISE_VAR_DIR", str(tmp_path))
    monkeypatch.setenv("STEPWISE_API_KEYS", "team-a:sk_real_one")
    monkeypatch.setenv("STEPWISE_REDIS_URL", "redis://127.0.0.1:6390/0")  # read, never connected to here
    for name in ("STEPWISE_ADMIN_API_KEYS", "STEPWISE_WEBHOOK_SECRET", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def refused_by(name: str) -> list[str]:
    """The processes (api, worker) that refuse to start, naming `name` and not echoing its value."""
    refusing = []
    for process in readers_of(name):
        try:
            READERS[process]()
        except SettingsError as e:
            assert str(e).startswith(f"{name} holds a placeholder"), str(e)
            refusing.append(process)
    return refusing


@pytest.mark.parametrize("name", SECRETS)
@pytest.mark.parametrize("word", SPELLINGS)
def test_every_secret_holding_a_placeholder_in_any_spelling_is_refused_at_start_naming_it(env, name, word):
    value = SECRETS[name](word)
    env.setenv(name, value)

    assert refused_by(name) == readers_of(name)


@pytest.mark.parametrize("name", SECRETS)
def test_real_secrets_are_accepted(env, name):
    real = {
        "STEPWISE_API_KEYS": "team-a:sk_3dJ9x0QmVt1uP8sR_exchange,team-b:sk_kZ2Wq7",
        "STEPWISE_ADMIN_API_KEYS": "ops:sk_admin_Nq4vLx81",
        "STEPWISE_WEBHOOK_SECRET": "whsec_" + base64.b64encode(b"\x07" * 24).decode(),
        "STEPWISE_REDIS_URL": "rediss://:Zt8pQ1vX@127.0.0.1:6390/0",
        "AWS_ACCESS_KEY_ID": "AKIAIOSFODNN7EXAMPL1",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY",
    }[name]
    env.setenv(name, real)

    assert refused_by(name) == []


def test_a_redis_url_is_judged_by_its_password_alone():
    from settings.placeholders import secret_parts

    assert secret_parts("redis://:changeme@placeholder.internal:6379/0") == ["changeme"]
    assert secret_parts("redis://placeholder.internal:6379/0") == []  # a host name is no secret
    assert secret_parts("sentinel://:pw1@h1:26379;sentinel://:replace-me@h2:26379") == ["pw1", "replace-me"]


def test_every_secret_deploy_kubernetes_secret_yaml_holds_is_refused_at_start_naming_it(env):
    """What the file's header says ("placeholders every stepwise process refuses"), each value set alone."""
    values = yaml.safe_load(SECRET_YAML.read_text())["stringData"]
    secrets = {name: value for name, value in values.items() if name in SECRETS}

    assert set(secrets) == set(SECRETS)  # API keys, admin keys, webhook secret, Redis URL, both S3 keys
    assert is_placeholder(values["scaler-token"])  # KEDA's copy of the keda admin key
    for name, value in secrets.items():
        with env.context() as one:
            one.setenv(name, value)
            assert refused_by(name) == readers_of(name), name
