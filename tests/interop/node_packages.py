"""The pinned npm packages of the Node.js peers, installed into ``node/node_modules`` on first use.

Used by the interop fixtures and by the chaos run's Node.js worker.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.interop.peers import NODE_DIR

__all__ = ["NPM_INSTALL_TIMEOUT_S", "ensure"]

#: Longest time ``npm install`` may take, in seconds.
NPM_INSTALL_TIMEOUT_S = 300


def _pinned_versions() -> dict[str, str]:
    manifest = json.loads((NODE_DIR / "package.json").read_text(encoding="utf-8"))
    pins: dict[str, str] = manifest["dependencies"]
    return pins


def _installed_version(package: str) -> str | None:
    manifest = NODE_DIR / "node_modules" / package / "package.json"
    if not manifest.is_file():
        return None
    version: str = json.loads(manifest.read_text(encoding="utf-8"))["version"]
    return version


def _stale_packages() -> list[str]:
    return [
        f"{package}@{pin} (found {_installed_version(package) or 'nothing'})"
        for package, pin in _pinned_versions().items()
        if _installed_version(package) != pin
    ]


def ensure() -> Path:
    """Return ``node/node_modules`` holding the pinned packages, running ``npm install`` if not.

    ``npm install --no-audit --no-fund`` follows the committed lock file.
    Parallel runs share the folder: one installs, the others wait.

    Raises:
        RuntimeError: ``npm`` is missing, or the install failed, took too long
            or left other versions.
    """
    digest = hashlib.sha1(str(NODE_DIR).encode()).hexdigest()[:12]
    lock_path = Path(tempfile.gettempdir()) / f"echomq-interop-npm-{digest}.lock"
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _stale_packages():
            npm = shutil.which("npm")
            if npm is None:
                raise RuntimeError("`npm` is not on PATH")
            try:
                result = subprocess.run(
                    [npm, "install", "--no-audit", "--no-fund"],
                    cwd=NODE_DIR,
                    capture_output=True,
                    text=True,
                    timeout=NPM_INSTALL_TIMEOUT_S,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise RuntimeError(
                    f"npm install in {NODE_DIR} took over {NPM_INSTALL_TIMEOUT_S}s"
                ) from None
            if result.returncode != 0:
                raise RuntimeError(
                    f"npm install in {NODE_DIR} failed ({result.returncode}):\n"
                    f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
                )
            stale = _stale_packages()
            if stale:
                raise RuntimeError(
                    f"npm install in {NODE_DIR} left wrong versions: {', '.join(stale)}"
                )
    return NODE_DIR / "node_modules"
