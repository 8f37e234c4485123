"""Sentinel URLs and copies of Sentinel-managed clients: parsing, redaction, what a copy keeps.

No server: these read URLs and client objects only.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.sentinel

from actors.connection import (
    client_like,
    client_settings,
    describe_connection,
    parse_sentinel_url,
    redacted_url,
)

SECRET = "s3cr"


@pytest.mark.parametrize("char", ["#", "?"])
def test_a_password_that_parses_is_never_printed_by_redacted_url(char: str) -> None:
    url = f"redis+sentinel://:{SECRET}{char}t@127.0.0.1:26379/mymaster"
    parsed = parse_sentinel_url(url)
    assert parsed is not None and parsed.password == f"{SECRET}{char}t"  # the URL works...
    assert SECRET not in redacted_url(url)  # ...so its password must not be printed
    assert SECRET not in describe_connection(url)


def test_a_query_string_is_not_silently_made_part_of_the_service_name() -> None:
    # ?db=2 is how redis:// URLs give the database; here it becomes the service "m?db=2".
    try:
        parsed = parse_sentinel_url("redis+sentinel://127.0.0.1:26379/mymaster?db=2")
    except ValueError:
        return
    assert parsed is not None
    assert (parsed.service, parsed.db) == ("mymaster", 2)


def test_a_password_in_a_query_string_is_masked_or_refused() -> None:
    url = f"redis+sentinel://127.0.0.1:26379/mymaster?password={SECRET}"
    try:
        parse_sentinel_url(url)
    except ValueError as exc:
        assert SECRET not in str(exc)
        return
    assert SECRET not in redacted_url(url)


def test_an_uppercase_rediss_sentinel_scheme_still_means_tls() -> None:
    # The scheme is matched case-insensitively, but TLS is read from the raw scheme.
    lower = parse_sentinel_url("rediss+sentinel://127.0.0.1/mymaster")
    upper = parse_sentinel_url("REDISS+SENTINEL://127.0.0.1/mymaster")
    assert lower is not None and lower.ssl
    assert upper is not None and upper.ssl


def test_a_port_out_of_range_is_refused_when_the_url_is_read() -> None:
    # Documented: "Raises ValueError: ... a bad port". redis://h:99999 is refused at start.
    with pytest.raises(ValueError):
        parse_sentinel_url("redis+sentinel://127.0.0.1:99999/mymaster")


def test_an_empty_sentinel_host_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_sentinel_url("redis+sentinel://:26379/mymaster")


def test_a_bad_port_error_does_not_echo_part_of_a_password() -> None:
    # An unencoded '/' in the password ends the host list early; the error names the rest.
    with pytest.raises(ValueError) as raised:
        parse_sentinel_url(f"redis+sentinel://user:{SECRET}/x@127.0.0.1/mymaster")
    assert SECRET not in str(raised.value)


def _tls_sentinel_client() -> redis.Redis:
    sentinels = redis.sentinel.Sentinel(
        [("127.0.0.1", 26379)],
        sentinel_kwargs={"password": "sentinel-pw", "ssl": True, "ssl_cert_reqs": "none"},
    )
    client: redis.Redis = sentinels.master_for(
        "mymaster", ssl=True, ssl_cert_reqs="none", ssl_ca_certs="/etc/ca.pem", password="pw"
    )
    return client


def test_a_copied_sentinel_managed_tls_client_keeps_its_ssl_options() -> None:
    # A plain rediss:// client's ssl_* are copied (connection.py _settings_of); a
    # Sentinel-managed one's are dropped, so the child verifies against the default CA.
    settings = client_settings(_tls_sentinel_client())
    assert settings.get("ssl_cert_reqs") == "none"
    assert settings.get("ssl_ca_certs") == "/etc/ca.pem"
    copy = client_like(settings, timeout=1.0)
    kwargs = copy.connection_pool.connection_kwargs
    assert kwargs.get("ssl_cert_reqs") == "none"


def test_a_copied_client_reaches_tls_sentinels_over_tls() -> None:
    copy = client_like(client_settings(_tls_sentinel_client()), timeout=1.0)
    pool: Any = copy.connection_pool
    kwargs = pool.sentinel_manager.sentinel_kwargs
    assert kwargs.get("password") == "sentinel-pw"  # held
    assert kwargs.get("ssl") is True


def test_a_copied_client_keeps_force_master_ip() -> None:
    sentinels = redis.sentinel.Sentinel([("127.0.0.1", 26379)], force_master_ip="10.9.9.9")
    copy = client_like(client_settings(sentinels.master_for("mymaster")), timeout=1.0)
    pool: Any = copy.connection_pool
    assert pool.sentinel_manager._force_master_ip == "10.9.9.9"
