"""MkDocs hooks: files from the repository that the site shows without copying them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[2]

#: Site path -> repository file. The demo redraws the timeline; the site shows the checked-in one.
SHARED = {"img/timeline.png": ROOT / "examples" / "timeline.png"}


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    """Add the repository's own images to the site."""
    for dest, source in SHARED.items():
        files.append(File.generated(config, dest, abs_src_path=str(source)))
    return files
