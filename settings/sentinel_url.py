"""A Redis Sentinel URL, as STEPWISE_REDIS_URL takes it: Celery's form, one `sentinel://` part per sentinel.

    sentinel://[[user]:password@]host:port;sentinel://host:port[/DB][?query]
    sentinels://...                      the same over TLS, to the sentinels and to the master

The password (and user) is the master's, as in Celery's form; `DB` the database, 0 when not given. The query
holds `master_name` (STEPWISE_REDIS_SENTINEL_MASTER is folded in here: storage.redis_location),
`sentinel_password` (the sentinels' own, when their `requirepass` is set), and with `sentinels://` the TLS
options a `rediss://` URL takes (`ssl_cert_reqs`, `ssl_ca_certs`, `ssl_certfile`, `ssl_keyfile`). Parts may each
carry a password, a DB or a query; where several do, they must agree.

Standard library only: the settings table checks the URL with it, and storage.redis_clients connects by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from settings.redis_tls import TLS_OPTIONS, checked_tls_options

SCHEMES = ("sentinel", "sentinels")
DEFAULT_PORT = 26379
OPTIONS = ("master_name", "sentinel_password", *TLS_OPTIONS)


def is_sentinel_url(text: str) -> bool:
    return text.partition("://")[0] in SCHEMES


@dataclass(frozen=True)
class SentinelUrl:
    sentinels: tuple[tuple[str, int], ...]
    master_name: str = ""  # "": not named yet (STEPWISE_REDIS_SENTINEL_MASTER adds it)
    db: int = 0
    username: str = ""  # the master's credentials
    password: str = ""
    sentinel_password: str = ""  # the sentinels' own; "": they ask for none
    tls: dict[str, str] = field(default_factory=dict)  # TLS options in redis-py's words; {} for sentinel://

    @property
    def is_tls(self) -> bool:
        return bool(self.tls)

    @classmethod
    def parse(cls, name: str, text: str) -> SentinelUrl:
        """The URL's parts, or ValueError naming `name` (the variable) and what is wrong."""
        hosts: list[tuple[str, int]] = []
        schemes: set[str] = set()
        dbs: set[str] = set()
        users: set[str] = set()
        passwords: set[str] = set()
        query: dict[str, str] = {}
        for part in text.split(";"):
            parts = urlsplit(part.strip())
            schemes.add(parts.scheme)
            try:
                port = parts.port or DEFAULT_PORT
            except ValueError:
                raise ValueError(f"{name}: {part!r} has no valid port") from None
            if parts.scheme not in SCHEMES or not parts.hostname:
                raise ValueError(f"{name}: each part of a Sentinel URL is sentinel://host:port (got {part!r})")
            hosts.append((parts.hostname, port))
            if parts.path.strip("/"):
                dbs.add(parts.path.strip("/"))
            if parts.username:
                users.add(unquote(parts.username))
            if parts.password:
                passwords.add(unquote(parts.password))
            for key, value in parse_qsl(parts.query, keep_blank_values=True):
                if key not in OPTIONS:
                    raise ValueError(f"{name}: a Sentinel URL takes {', '.join(OPTIONS)} in its query (got {key!r})")
                if query.setdefault(key, value) != value:
                    raise ValueError(f"{name}: its parts give {key} two values")
        for what, values in (("schemes", schemes), ("databases", dbs), ("users", users), ("passwords", passwords)):
            if len(values) > 1:
                raise ValueError(f"{name}: its parts name two {what}; give one for all")
        db = dbs.pop() if dbs else "0"
        if not db.isdigit():
            raise ValueError(f"{name}: the database after the last sentinel must be a number (got {db!r})")
        return cls(
            sentinels=tuple(hosts),
            master_name=query.pop("master_name", ""),
            db=int(db),
            username=users.pop() if users else "",
            password=passwords.pop() if passwords else "",
            sentinel_password=query.pop("sentinel_password", ""),
            tls=parse_tls(name, schemes.pop() == "sentinels", query),
        )

    def to_text(self) -> str:
        """The URL, spelled as `parse` reads it back: the credentials on the first part, the DB and query on the
        last."""
        scheme = "sentinels" if self.is_tls else "sentinel"
        userinfo = ""
        if self.username or self.password:
            userinfo = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
        hosts = [f"{scheme}://{host}:{port}" for host, port in self.sentinels]
        hosts[0] = hosts[0].replace("://", f"://{userinfo}", 1)
        query = {"master_name": self.master_name, "sentinel_password": self.sentinel_password, **self.tls}
        text = ";".join(hosts) + f"/{self.db}"
        options = {key: value for key, value in query.items() if value}
        return text + (f"?{urlencode(options, safe='/:')}" if options else "")

    def celery_url(self) -> str:
        """Celery's own form (kombu and Celery's result backend read it): every part `sentinel://` with the
        master's credentials and the DB; the master name and TLS go in Celery's options
        (storage.redis_clients.celery_redis_config)."""
        userinfo = ""
        if self.username or self.password:
            userinfo = f"{quote(self.username, safe='')}:{quote(self.password, safe='')}@"
        return ";".join(f"sentinel://{userinfo}{host}:{port}/{self.db}" for host, port in self.sentinels)

    def describe(self) -> str:
        """For log lines and errors: no password."""
        hosts = ",".join(f"{host}:{port}" for host, port in self.sentinels)
        return f"master {self.master_name or '?'} of the sentinels {hosts}{' (TLS)' if self.is_tls else ''}"


def parse_tls(name: str, is_tls: bool, query: dict[str, str]) -> dict[str, str]:
    if not is_tls:
        if query:
            raise ValueError(f"{name} names {', '.join(query)}: TLS needs a sentinels:// URL")
        return {}
    return checked_tls_options(name, query)
