"""Build the sdist and the wheel, check them, and install them the ways the docs say.

``make package`` runs this from the repository's root:

1. a copy of the checkout (the files git tracks or would track, as they are in
   the working tree) is what everything builds and installs from;
2. ``python -m build`` writes the sdist into ``dist/``, then builds the wheel
   from that sdist, which proves the sdist builds;
3. ``twine check --strict`` on both, then their contents: every file of the
   package (the Lua scripts and ``py.typed`` among them) as it is in the tree,
   the top-level ``lua/extendLocks-1.lua`` that other runtimes read, and the
   metadata (name, version, licence, the README as the description, the
   extras, the ``echomq-locks`` script);
4. for each extra (and none), a fresh virtual environment with the wheel
   installed with that extra, and what the extra enables imported and run;
5. each line of the ``sh`` block of the README's and Getting started's
   ``## Install`` sections, run as written in a fresh environment from the
   copy's root, then the same checks for the extras the line names.

The environments have no pip of their own (``venv --without-pip``): this
interpreter's pip installs into them (``pip --python``), and a ``pip`` script
in each does the same for the documented lines. They run a few at a time.
"""

from __future__ import annotations

import argparse
import configparser
import email.parser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import venv
import zipfile
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = "echomq-actors"
#: The distribution's name as the archives spell it.
ARCHIVE_NAME = "echomq_actors"
#: The pages whose ``## Install`` section is run line by line.
INSTALL_DOCS = ("README.md", "docs/guides/getting-started.md")
#: The script other runtimes read, at the top of the tree (a link into the package).
SHARED_SCRIPT = "lua/extendLocks-1.lua"
#: Room the scratch folder needs: the wheelhouse, and a few environments at once.
SCRATCH_BYTES = 2 * 1024**3
#: Installs running at once: they mostly wait on the index and the disk.
DEFAULT_JOBS = 3

#: Every install: the package comes from the environment, says its version and
#: reads its Lua scripts as package data. argv: the version, the scripts' names.
CHECK_PACKAGE = """
import sys
import actors
from actors.scripts import script_source
version, *scripts = sys.argv[1:]
assert actors.__file__.startswith(sys.prefix), actors.__file__
assert actors.__version__ == version, (actors.__version__, version)
for name in scripts:
    assert "redis.call" in script_source(name), name
"""

#: No extra: the optional parts say what is missing and stay off.
CHECK_BARE = """
from actors import telemetry
try:
    import actors.bullmq
except ImportError as error:
    assert "[bullmq]" in str(error), error
else:
    raise AssertionError("actors.bullmq imports without the bullmq extra")
assert telemetry._get_tracer() is None, "a tracer without the otel extra"
"""

#: ``[server]``: both private servers start, and the installed script renews a lock on each.
CHECK_SERVER = """
import redis
from actors import QueueKeys, extend_locks
from actors.embedded import EmbeddedServer
keys = QueueKeys("wheel")
for engine in ("valkey", "redis"):
    with EmbeddedServer(engine) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=10)
        client.set(keys.lock("1"), "token", px=1000)
        assert extend_locks(client, keys, ["1"], ["token"], 30000) == [], engine
        assert client.pttl(keys.lock("1")) > 29000, engine
        client.close()
"""

#: ``[bullmq]``: the Worker integration imports with the bullmq the extra pins.
CHECK_BULLMQ = """
import bullmq
from actors.bullmq import ActorLockManager, use_actor_lock_manager
assert callable(use_actor_lock_manager) and issubclass(ActorLockManager, object)
"""

#: ``[otel]``: the telemetry module finds OpenTelemetry and opens a tick's span.
CHECK_OTEL = """
import time
from actors import BatchOutcome, telemetry
assert telemetry._get_tracer() is not None, "the otel extra leaves telemetry off"
now = time.time_ns()
facts = telemetry.span_facts(BatchOutcome([], []), 1, 0.0, 0.0)
telemetry.tick_span("wheel", 1, now, now + 1, facts)
"""

#: ``[demo]``: what the demo's live view and its timeline picture import.
CHECK_DEMO = """
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot
from rich.console import Console
from rich.live import Live
"""

#: ``[docs]``: what ``make docs`` runs.
CHECK_DOCS = """
import material
import mkdocs
import mkdocstrings
import mkdocstrings_handlers.python
import pymdownx
"""


@dataclass(frozen=True)
class ExtraCheck:
    """What installing an extra must enable: code to run, commands that must succeed."""

    code: tuple[str, ...] = ()
    commands: tuple[tuple[str, ...], ...] = ()
    #: Relative cost, to start the longest installs first.
    weight: int = 1


#: One entry per extra of the wheel's metadata ("" for none); a new extra needs one.
EXTRAS: dict[str, ExtraCheck] = {
    "": ExtraCheck(code=(CHECK_BARE,)),
    "server": ExtraCheck(code=(CHECK_SERVER,), weight=2),
    "bullmq": ExtraCheck(code=(CHECK_BULLMQ,), weight=2),
    "otel": ExtraCheck(code=(CHECK_OTEL,)),
    "demo": ExtraCheck(code=(CHECK_SERVER, CHECK_DEMO), weight=4),
    "docs": ExtraCheck(code=(CHECK_DOCS,), commands=(("mkdocs", "--version"),), weight=4),
}
#: Extras not installed here, and why.
SKIPPED = {
    "test": "the union of the others and the tools; make builds .venv with it on every run",
}
#: Every install: the command line, both ways.
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("echomq-locks", "--help"),
    ("python", "-m", "actors", "--help"),
)


class CheckFailed(Exception):
    """A command failed or a check did not hold; the message says which and shows its output."""


def declared_version(root: Path = ROOT) -> str:
    """The version ``pyproject.toml`` declares."""
    text = (root / "pyproject.toml").read_text(encoding="utf-8")
    found = re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)
    if found is None:
        raise CheckFailed("pyproject.toml declares no version")
    return found.group(1)


def install_block(page: str) -> list[str]:
    """The lines of the ``sh`` block of a Markdown page's ``## Install`` section."""
    section = re.search(r"^## Install\n(.*?)(?=^## |\Z)", page, re.MULTILINE | re.DOTALL)
    if section is None:
        raise CheckFailed("no '## Install' section")
    block = re.search(r"^```sh\n(.*?)^```$", section.group(1), re.MULTILINE | re.DOTALL)
    if block is None:
        raise CheckFailed("no sh block in the Install section")
    return block.group(1).splitlines()


def install_lines(page: str) -> list[str]:
    """The commands of the page's Install block, one a line, their comments left off."""
    lines = (re.sub(r"(^|\s+)#.*$", "", line).strip() for line in install_block(page))
    return [line for line in lines if line]


def extras_named(line: str) -> frozenset[str]:
    """The extras a documented install line asks for (``'.[server,otel]'``)."""
    return frozenset(
        extra.strip()
        for group in re.findall(r"\[([\w,\s-]+)\]", line)
        for extra in group.split(",")
    )


def run(command: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run a command; its output, or :class:`CheckFailed` with the end of it."""
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()
        raise CheckFailed(
            f"exit {done.returncode}: {shlex.join(command)}\n    " + "\n    ".join(output[-25:])
        )
    return done.stdout + done.stderr


def copy_checkout(target: Path, root: Path = ROOT) -> None:
    """Copy the files git tracks, or would, as the working tree has them (links as links)."""
    listed = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root)
    for name in filter(None, listed.split("\0")):
        source = root / name
        if not source.is_symlink() and not source.exists():
            continue  # deleted in the working tree
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / name, follow_symlinks=False)


def package_files(root: Path = ROOT) -> dict[str, bytes]:
    """The package's files in a tree, by the path the wheel gives them."""
    return {
        path.relative_to(root).as_posix(): path.read_bytes()
        for path in sorted((root / "actors").rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def wheel_problems(wheel: Path, root: Path, version: str) -> list[str]:
    """What is wrong with a wheel of the tree at ``root``: contents and metadata."""
    problems: list[str] = []
    expected = package_files(root)
    info = f"{ARCHIVE_NAME}-{version}.dist-info/"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        if missing := sorted(expected.keys() - names):
            problems.append(f"the wheel lacks {missing}")
        if stray := sorted(name for name in names - expected.keys() if not name.startswith(info)):
            problems.append(f"the wheel carries what the package has not: {stray}")
        problems += [
            f"{name} differs from the tree's"
            for name in sorted(expected.keys() & names)
            if archive.read(name) != expected[name]
        ]
        shared = (root / SHARED_SCRIPT).read_bytes()
        if expected.get("actors/lua/extendLocks-1.lua") != shared:
            problems.append(f"the package's extendLocks-1.lua is not {SHARED_SCRIPT}")
        if "actors/py.typed" not in names:
            problems.append("the wheel has no actors/py.typed")
        if info + "METADATA" not in names:
            return [*problems, f"the wheel has no {info}METADATA"]
        metadata = email.parser.Parser().parsestr(archive.read(info + "METADATA").decode())
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(info + "entry_points.txt").decode())
    readme = (root / "README.md").read_text(encoding="utf-8")
    problems += metadata_problems(metadata, readme, version)
    if entry_points.get("console_scripts", "echomq-locks", fallback=None) != "actors.cli:main":
        problems.append("the wheel's echomq-locks script is not actors.cli:main")
    return problems


def metadata_problems(metadata: email.message.Message, readme: str, version: str) -> list[str]:
    """What is wrong with a distribution's core metadata (the wheel's or the sdist's)."""
    expected = {
        "Name": NAME,
        "Version": version,
        "License-Expression": "MIT",
        "Description-Content-Type": "text/markdown",
        "Requires-Python": ">=3.10",
    }
    problems = [
        f"metadata {field}: {metadata.get(field)!r}, not {value!r}"
        for field, value in expected.items()
        if metadata.get(field) != value
    ]
    if str(metadata.get_payload()).strip() != readme.strip():
        problems.append("the long description is not README.md")
    extras = set(metadata.get_all("Provides-Extra") or ())
    if unknown := sorted(extras - EXTRAS.keys() - SKIPPED.keys()):
        problems.append(f"extras with no install check here: {unknown}")
    if gone := sorted(EXTRAS.keys() - {""} - extras):
        problems.append(f"extras checked here that the package no longer has: {gone}")
    return problems


def sdist_problems(sdist: Path, root: Path, version: str) -> list[str]:
    """What is wrong with an sdist of the tree at ``root``."""
    with tarfile.open(sdist) as archive:
        members = {
            member.name.partition("/")[2]: member
            for member in archive.getmembers()
            if member.isfile() or member.issym()
        }
        need = {"PKG-INFO", "pyproject.toml", "README.md", "CHANGELOG.md", SHARED_SCRIPT}
        problems = [
            f"the sdist lacks {name}"
            for name in sorted(need | package_files(root).keys())
            if name not in members
        ]
        shared = members.get(SHARED_SCRIPT)
        if shared is not None and shared.issym():
            if shared.linkname != os.readlink(root / SHARED_SCRIPT):
                problems.append(f"the sdist's {SHARED_SCRIPT} links to {shared.linkname}")
        elif shared is not None:
            stream = archive.extractfile(shared)
            if stream is None or stream.read() != (root / SHARED_SCRIPT).read_bytes():
                problems.append(f"the sdist's {SHARED_SCRIPT} differs from the tree's")
        pkg_info = archive.extractfile(members["PKG-INFO"]) if "PKG-INFO" in members else None
        if pkg_info is not None:
            metadata = email.parser.Parser().parsestr(pkg_info.read().decode())
            readme = (root / "README.md").read_text(encoding="utf-8")
            problems += [f"sdist {p}" for p in metadata_problems(metadata, readme, version)]
    return problems


@dataclass(frozen=True)
class Install:
    """One fresh environment: the wheel with some extras, or a documented line."""

    label: str
    extras: frozenset[str]
    #: A shell line from the docs, run in the checkout's copy; None: the wheel.
    line: str | None = None

    @property
    def weight(self) -> int:
        """Relative cost of the install."""
        return sum(EXTRAS[extra].weight for extra in self.extras | {""}) + (self.line is not None)


def fresh_env(path: Path, wheels: Path) -> tuple[Path, dict[str, str]]:
    """A virtual environment without pip, a ``pip`` that installs into it from ``wheels``.

    Returns its Python and the environment variables that activate it.
    """
    venv.EnvBuilder(with_pip=False).create(path)
    bin_dir = path / "bin"
    python = bin_dir / "python"
    pip = bin_dir / "pip"
    pip.write_text(
        "#!/bin/sh\n"
        f'exec {shlex.quote(sys.executable)} -m pip --python {shlex.quote(str(python))} "$@"\n'
    )
    pip.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env |= {
        "TMPDIR": str(path.parent),
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "VIRTUAL_ENV": str(path),
        # pip reads the variable of a "--no-" option inverted: 0 means --no-compile.
        "PIP_NO_COMPILE": "0",
        "PIP_QUIET": "1",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
    }
    return python, env


def check_install(
    install: Install, wheel: Path, wheels: Path, checkout: Path, work: Path, version: str
) -> float:
    """Install into a fresh environment, check what its extras enable; the seconds it took."""
    started = time.monotonic()
    env_dir = Path(tempfile.mkdtemp(prefix="env-", dir=work))
    python, env = fresh_env(env_dir, wheels)
    if install.line is None:
        wanted = f"{wheel}[{','.join(sorted(install.extras))}]" if install.extras else str(wheel)
        run([str(python.parent / "pip"), "install", wanted], cwd=work, env=env)
    else:
        run(["bash", "-e", "-c", install.line], cwd=checkout, env=env)
    scripts = sorted(path.name for path in (checkout / "actors" / "lua").glob("*.lua"))
    checks = [EXTRAS[extra] for extra in sorted(install.extras)] or [EXTRAS[""]]
    # one interpreter runs every check of the install, each once
    code = "\n".join(dict.fromkeys([CHECK_PACKAGE, *(c for check in checks for c in check.code)]))
    run([str(python), "-c", code, version, *scripts], cwd=env_dir, env=env)
    for command in (*COMMANDS, *(command for check in checks for command in check.commands)):
        run(list(command), cwd=env_dir, env=env)
    shutil.rmtree(env_dir, ignore_errors=True)
    return time.monotonic() - started


def documented_installs(checkout: Path) -> tuple[list[Install], list[str]]:
    """The installs the Install sections call for, and the lines left to others' runs.

    Every README line runs as written, in an environment of its own. A line of
    another page runs too, unless it is the README's source install with extras
    the wheel is installed with (``pip install '.[docs]'``): the README's runs
    build the checkout, ``wheel[docs]`` installs the same requirements.
    """
    pages: dict[str, list[str]] = {}
    for doc in INSTALL_DOCS:
        try:
            lines = install_lines((checkout / doc).read_text(encoding="utf-8"))
        except CheckFailed as error:
            raise CheckFailed(f"{doc}: {error}") from None
        for line in lines:
            pages.setdefault(line, []).append(doc)
    readme = pages.keys() - {line for line, docs in pages.items() if INSTALL_DOCS[0] not in docs}
    installs: list[Install] = []
    covered: list[str] = []
    for line, docs in pages.items():
        extras = extras_named(line)
        label = f"{line}   ({', '.join(docs)})"
        if (
            line not in readme
            and "pip install ." in readme
            and re.fullmatch(r"pip install '\.\[[\w,-]+\]'", line)
            and extras <= EXTRAS.keys()
        ):
            wheels = ", ".join(f"wheel[{extra}]" for extra in sorted(extras))
            covered.append(f"{label}: pip install . builds the checkout, {wheels} the rest")
        else:
            installs.append(Install(label=label, extras=extras, line=line))
    return installs, covered


def fill_wheelhouse(checkout: Path, wheels: Path) -> Path:
    """Download, once, what every extra and every documented line installs; return the folder.

    The environments then install offline from it: the same resolution, without
    fetching the same files a dozen times.
    """
    extras = ",".join(sorted(EXTRAS.keys() - {""}))
    # hatchling: pip's build of the checkout; build: the documented wheel line.
    wanted = [f"{checkout}[{extras}]", "hatchling", "build"]
    run([sys.executable, "-m", "pip", "download", "-q", "-d", str(wheels), *wanted], cwd=checkout)
    return wheels


def build(checkout: Path, dist: Path) -> tuple[Path, Path]:
    """Build the sdist, then the wheel from it, into an emptied ``dist``."""
    shutil.rmtree(dist, ignore_errors=True)
    log = run([sys.executable, "-m", "build", "--outdir", str(dist), str(checkout)], cwd=checkout)
    if "Building wheel from sdist" not in log:
        raise CheckFailed("python -m build did not build the wheel from the sdist")
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    return sdist, wheel


def scratch_parent() -> str | None:
    """Where the environments go: memory when it has room (a disk's writes cost most here)."""
    shm = Path("/dev/shm")
    try:
        roomy = shutil.disk_usage(shm).free >= SCRATCH_BYTES and os.access(shm, os.W_OK)
    except OSError:
        roomy = False
    return str(shm) if roomy else None


def lap(since: float) -> float:
    """Seconds since a ``time.monotonic()`` reading."""
    return time.monotonic() - since


def main(argv: list[str] | None = None) -> int:
    """Run every check; 0 if all hold."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", type=Path, default=ROOT / "dist", help="where to build")
    parser.add_argument("--jobs", type=int, default=DEFAULT_JOBS, help="installs at once")
    args = parser.parse_args(argv)
    started = time.monotonic()
    failures: list[str] = []
    covered: list[str] = []

    def report(label: str, seconds: float, error: str | None = None) -> None:
        print(f"{'FAIL' if error else 'ok':4} {seconds:5.1f} s  {label}", flush=True)
        if error:
            print(f"     {error}", flush=True)
            failures.append(label)

    with (
        tempfile.TemporaryDirectory(prefix="check-dist-", dir=scratch_parent()) as scratch,
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
    ):
        work = Path(scratch)
        checkout = work / "checkout"
        copy_checkout(checkout)
        version = declared_version(checkout)
        installs: list[tuple[Install, float, Future[float]]] = []

        def submit(batch: list[Install], wheel: Path, wheels: Path) -> None:
            for install in sorted(batch, key=lambda each: -each.weight):
                job = pool.submit(check_install, install, wheel, wheels, checkout, work, version)
                installs.append((install, time.monotonic(), job))

        # The wheelhouse downloads while the sdist and the wheel build; the
        # documented lines need no wheel and start as soon as it is there.
        fetching = pool.submit(fill_wheelhouse, checkout, work / "wheelhouse")
        building = pool.submit(build, checkout, args.dist)
        try:
            documented, covered = documented_installs(checkout)
            wheels = fetching.result()
            report("pip download: every extra's requirements, once", lap(started))
            submit(documented, Path(), wheels)
            sdist, wheel = building.result()
            report(f"python -m build: {sdist.name}, then {wheel.name} from it", lap(started))
            since = time.monotonic()
            twine = [sys.executable, "-m", "twine", "check", "--strict", str(sdist), str(wheel)]
            run(twine, cwd=work)
            report("twine check --strict", lap(since))
            since = time.monotonic()
            problems = wheel_problems(wheel, checkout, version)
            problems += sdist_problems(sdist, checkout, version)
            report("contents and metadata", lap(since), "\n     ".join(problems) or None)
            by_wheel = [
                Install(f"wheel[{x}]" if x else "wheel", frozenset({x} - {""})) for x in EXTRAS
            ]
            submit(by_wheel, wheel, wheels)
        except CheckFailed as error:
            report("build", lap(started), str(error))
        for install, since, job in installs:
            try:
                report(install.label, job.result())
            except CheckFailed as error:
                report(install.label, lap(since), str(error))
    for line in covered:
        print(f"covered       {line}")
    for extra, why in SKIPPED.items():
        print(f"skip          wheel[{extra}]: {why}")
    took = lap(started)
    print(f"make package: {len(installs)} installs, {len(failures)} failed, {took:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
