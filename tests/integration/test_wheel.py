"""The built wheel carries the Lua script and renews a lock from a fresh environment."""

from __future__ import annotations

import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import redis

import actors
from actors import QueueKeys
from tests.conftest import Server
from tests.support import new_token

ROOT = Path(__file__).resolve().parents[2]

RENEW_ONE = """
import sys, redis, actors
from actors import QueueKeys, extend_locks
assert "site-packages" in actors.__file__, actors.__file__
url, token = sys.argv[1], sys.argv[2]
client = redis.Redis.from_url(url, socket_timeout=10)
print(extend_locks(client, QueueKeys("wheel"), ["j1"], [token], 30000))
"""


def test_wheel_installs_and_renews_from_a_fresh_venv(
    tmp_path: Path, server: Server, redis_client: redis.Redis
) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = dist.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {
        f"actors/lua/{name}" for name in ("extendLocks-1.lua", "releaseLock-1.lua", "fence-2.lua")
    } <= names
    assert "actors/py.typed" in names

    env_dir = tmp_path / "env"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(wheel)],
        check=True,
        capture_output=True,
    )
    token = new_token()
    redis_client.set(QueueKeys("wheel").lock("j1"), token, px=1000)
    redis_client.sadd(QueueKeys("wheel").stalled, "j1")

    result = subprocess.run(
        [str(python), "-c", RENEW_ONE, server.url, token],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )

    assert result.stdout.strip() == "[]"
    assert redis_client.pttl("emq:wheel:j1:lock") > 29000
    assert not redis_client.sismember("emq:wheel:stalled", "j1")


def test_the_package_says_the_version_its_metadata_says() -> None:
    # pyproject.toml and actors.__version__ once named two different releases.
    declared = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert declared is not None
    assert actors.__version__ == declared.group(1)
