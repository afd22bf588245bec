"""The docs site builds with warnings as errors (`mkdocs build --strict`): a broken link or anchor, a page left out
of the nav or a missing include fails here like any other test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(tmp_path: Path, root: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f",
                           str(root / "mkdocs.yml"), "-d", str(tmp_path / "site")], cwd=root, capture_output=True,
                          text=True, timeout=300, env=os.environ | {"NO_MKDOCS_2_WARNING": "1"})


def test_the_docs_build_strict(tmp_path):
    result = build(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "config" / "index.html").is_file()
    assert "Benchmarks" in (tmp_path / "site" / "benchmarks" / "index.html").read_text()  # BENCHMARKS.md included


def test_a_broken_link_fails_the_build(tmp_path):
    import shutil

    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy)
    shutil.copy(ROOT / "BENCHMARKS.md", copy)
    page = copy / "docs" / "serving.md"
    page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    result = build(tmp_path, copy)
    assert result.returncode != 0 and "no-such-page.md" in result.stderr
