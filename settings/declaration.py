"""How a `STEPWISE_*` variable is declared (`Variable`) and read (`read`), and the kinds of value it holds.

A kind turns the variable's text into a value and refuses text it cannot take, with one line that names
the variable: `STEPWISE_JOB_TTL must be an integer, at least 1 (got '0')`. Unset and empty are the same:
the declared default.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from settings.errors import SettingsError
from settings.placeholders import check_secret
from settings.redis_tls import TLS_OPTIONS, checked_tls_options
from settings.sentinel_url import SCHEMES as SENTINEL_SCHEMES
from settings.sentinel_url import SentinelUrl, is_sentinel_url


class Kind:
    """What a variable holds: `parse` takes its text (never empty), `describe` says what text it takes."""

    def parse(self, name: str, text: str) -> Any:
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class Integer(Kind):
    minimum: int | None = None
    maximum: int | None = None

    def parse(self, name: str, text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise SettingsError(f"{name} must be {self.describe()} (got {text!r})") from None
        if (self.minimum is not None and value < self.minimum) or (self.maximum is not None and value > self.maximum):
            raise SettingsError(f"{name} must be {self.describe()} (got {value})")
        return value

    def describe(self) -> str:
        if self.minimum is not None and self.maximum is not None:
            return f"an integer from {self.minimum} to {self.maximum}"
        return "an integer" + (f", at least {self.minimum}" if self.minimum is not None else "")


@dataclass(frozen=True)
class Number(Kind):
    minimum: float | None = None  # the value may equal it
    above: float | None = None  # the value must be greater

    def parse(self, name: str, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        below = (self.minimum is not None and value < self.minimum) or (self.above is not None and value <= self.above)
        if not math.isfinite(value) or below:
            raise SettingsError(f"{name} must be {self.describe()} (got {text!r})")
        return value

    def describe(self) -> str:
        if self.above is not None:
            return f"a number above {self.above:g}"
        return "a number" + (f", at least {self.minimum:g}" if self.minimum is not None else "")


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Flag(Kind):
    def parse(self, name: str, text: str) -> bool:
        word = text.strip().lower()
        if word not in TRUE_WORDS + FALSE_WORDS:
            raise SettingsError(f"{name} must be {self.describe()} (got {text!r})")
        return word in TRUE_WORDS

    def describe(self) -> str:
        return "one of 1/0, true/false, yes/no, on/off"


@dataclass(frozen=True)
class Choice(Kind):
    options: tuple[str, ...]

    def parse(self, name: str, text: str) -> str:
        if text not in self.options:
            raise SettingsError(f"{name} must be {self.describe()} (got {text!r})")
        return text

    def describe(self) -> str:
        return "one of " + ", ".join(self.options)


@dataclass(frozen=True)
class Url(Kind):
    """A URL whose scheme is one of `schemes` and which names a host (`file:` and `unix:`, a path)."""

    schemes: tuple[str, ...]

    def parse(self, name: str, text: str) -> str:
        parts = urlsplit(text)
        if parts.scheme not in self.schemes or not (parts.netloc or parts.scheme in ("file", "unix")):
            raise SettingsError(f"{name} must be {self.describe()} (got {text!r})")
        return text

    def describe(self) -> str:
        schemes = [f"{scheme}://" for scheme in self.schemes]
        return "a URL: " + (", ".join(schemes[:-1]) + " or " if len(schemes) > 1 else "") + schemes[-1]


@dataclass(frozen=True)
class RedisUrl(Url):
    """A Redis URL, as redis-py and Celery both read it. `rediss://` speaks TLS; its query may name
    `ssl_cert_reqs` (`required`, `optional`, `none`, or Celery's `CERT_REQUIRED` ...), `ssl_ca_certs` (a CA
    file), `ssl_certfile` and `ssl_keyfile` (a client certificate). The value is the URL spelled so both
    take it: `ssl_cert_reqs` in redis-py's words, `required` when not given (Celery's result backend
    refuses a `rediss://` URL without it, and certificates are checked unless the URL says otherwise).
    `sentinel://` (Celery's form, `sentinels://` over TLS) names the sentinels that find the master
    (settings.sentinel_url); its value is the URL as `SentinelUrl.to_text` spells it."""

    schemes: tuple[str, ...] = ("redis", "rediss", "unix", *SENTINEL_SCHEMES)

    def parse(self, name: str, text: str) -> str:
        if is_sentinel_url(text):
            try:
                return SentinelUrl.parse(name, text).to_text()
            except ValueError as e:
                raise SettingsError(str(e)) from None
        parts = urlsplit(super().parse(name, text))
        query = parse_qsl(parts.query, keep_blank_values=True)
        tls = [key for key, _ in query if key in TLS_OPTIONS]
        if parts.scheme != "rediss":
            if tls:
                raise SettingsError(f"{name} names {', '.join(tls)}: TLS needs a rediss:// URL (got {text!r})")
            return text
        try:
            options = checked_tls_options(name, dict(query))
        except ValueError as e:
            raise SettingsError(str(e)) from None
        return urlunsplit(parts._replace(query=urlencode(options, safe="/:")))

    def describe(self) -> str:
        return super().describe() + " (TLS options in the query, and Sentinel: docs/scaling.md)"


@dataclass(frozen=True)
class Text(Kind):
    """Text; `pattern` (a full match) is checked here, `form` is what the docs say of it. Text with a
    structure (pairs, JSON) is parsed by the module `form` names, which refuses it naming the variable."""

    form: str = "text"
    pattern: str | None = None

    def parse(self, name: str, text: str) -> str:
        if self.pattern is not None and not re.fullmatch(self.pattern, text):
            raise SettingsError(f"{name} must be {self.form} (got {text!r})")
        return text

    def describe(self) -> str:
        return self.form


@dataclass(frozen=True)
class Variable:
    name: str  # STEPWISE_...
    kind: Kind
    default: Any  # the value when unset or empty; None: none (the reader derives one: `default_text` says how)
    meaning: str  # one line, for docs/configuration.md and .env.example
    section: str  # a key of settings.table.SECTIONS: which processes read it
    default_text: str | None = None  # the default as the docs give it, where `default` alone does not say it
    example: str | None = None  # the value .env.example sets for docker compose; None: the default, commented out
    # a credential (of a URL: its password): a placeholder someone could read in a published file is refused
    # (settings.placeholders)
    is_secret: bool = False


def read_variable(variable: Variable, default: Any = None) -> Any:
    """The variable's value from the environment, checked; unset or empty: `default`, else its declared one."""
    text = os.environ.get(variable.name, "")
    if text == "":
        return variable.default if default is None else default
    if variable.is_secret:
        check_secret(variable.name, text)
    return variable.kind.parse(variable.name, text)
