"""The built wheel carries the Lua script and renews a lock from a fresh environment.

``make package`` (tests/packaging/check_dist.py) checks the sdist and the wheel
further: each extra, and each install line of the docs, in a fresh environment.
"""

from __future__ import annotations

import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
import redis

import actors
from actors import QueueKeys
from tests.conftest import Server
from tests.packaging.check_dist import (
    EXTRAS,
    INSTALL_DOCS,
    SKIPPED,
    declared_version,
    extras_named,
    install_block,
    install_lines,
    wheel_problems,
)
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
    # every file of the package (Lua scripts, py.typed) and the metadata
    assert wheel_problems(wheel, ROOT, declared_version()) == []

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
    assert actors.__version__ == declared_version()


def test_the_changelog_has_a_dated_section_for_the_version() -> None:
    # A release is the version pyproject.toml declares, with its changes under its own date.
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    version = re.escape(declared_version())
    assert re.search(rf"^## \[{version}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)


@pytest.mark.parametrize("doc", INSTALL_DOCS)
def test_each_install_section_names_the_version(doc: str) -> None:
    prose = (ROOT / doc).read_text(encoding="utf-8").split("## Install", 1)[1].split("```", 1)[0]
    assert f"Version {declared_version()}" in prose


@pytest.mark.parametrize("doc", INSTALL_DOCS)
def test_each_install_line_is_one_that_make_package_runs(doc: str) -> None:
    page = (ROOT / doc).read_text(encoding="utf-8")
    lines = install_lines(page)
    # each line is a whole command (make package runs each alone, in its own environment),
    assert not any(line.rstrip().endswith("\\") for line in install_block(page))
    assert len(lines) >= 3
    assert all(line.startswith("pip install ") for line in lines)
    assert lines[0] == "pip install ."
    # and asks for extras the package has.
    for line in lines:
        assert extras_named(line) <= EXTRAS.keys() - SKIPPED.keys() - {""}


def test_the_install_block_is_read_without_its_comments() -> None:
    page = """# Title

## Install

Text.

```sh
pip install .   # the base

# a note
pip install '.[a,b]'  # two extras
```

## Next

```sh
not this
```
"""
    assert install_lines(page) == ["pip install .", "pip install '.[a,b]'"]
    assert extras_named("pip install '.[a,b]'") == {"a", "b"}
    assert extras_named("pip install .") == frozenset()
