"""What ``make bullmq-latest`` reads from the pyproject: the supported range and CI's pin."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from tests.compat.latest import extra_range, pinned

PYPROJECT = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")


def test_the_release_ci_pins_is_in_the_range_the_bullmq_extra_supports() -> None:
    supported = SpecifierSet(extra_range(PYPROJECT))

    assert pinned(PYPROJECT) in supported


def test_a_pyproject_without_the_extra_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="bullmq"):
        extra_range('[project.optional-dependencies]\notel = ["opentelemetry-api>=1.23"]\n')
