"""`distill --help` and each command's `--help` teach: what the command does, its main choices and one command to
copy; `distill --version` says which code is running."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from distill.cli import COMMANDS, GUIDE, build_parser, main

ROOT = Path(__file__).resolve().parents[1]


def help_of(words: tuple[str, ...], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([*words, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("words", [w for w, _, _ in COMMANDS], ids=lambda w: " ".join(w))
def test_each_command_says_what_it_does_and_gives_an_example_that_parses(words, capsys):
    text = help_of(words, capsys)
    assert "example:" in text
    example = text.split("example:\n", 1)[1].strip().splitlines()[0].strip()
    argv = shlex.split(example)
    argv = [a for a in argv if "=" not in a or not a.split("=")[0].isupper()]  # drop `HF_TOKEN=...`
    if argv[:2] == ["accelerate", "launch"]:
        argv = ["distill", "train", *argv[argv.index("distill.train") + 1:]]
    assert argv[0] == "distill" and tuple(argv[1:1 + len(words)]) == words, example
    build_parser(argv[1:]).parse_args(argv[1:])  # the example's flags exist
    for path in re.findall(r"configs/\S+\.yaml", example):
        assert (ROOT / path).is_file(), f"{' '.join(words)} --help names {path}, which is not in configs/"


def test_improve_help_names_both_methods(capsys):
    text = " ".join(help_of(("improve",), capsys).split())
    assert "expert_iteration" in text and "grpo" in text


def test_every_command_has_a_guide():
    assert set(GUIDE) == {words for words, _, _ in COMMANDS}


def test_version_names_the_version_and_the_commit_in_a_checkout(capsys):
    from distill import __version__

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"distill {__version__}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    if head.returncode == 0:
        assert out == f"distill {__version__} (commit {head.stdout.strip()})"


def test_version_outside_a_checkout_is_just_the_version(tmp_path):
    """A copy of the package that is not in distill's own checkout (an install) has no commit to name."""
    import shutil

    shutil.copytree(ROOT / "distill", tmp_path / "pkg" / "distill", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # someone else's repository around it
    out = subprocess.run([sys.executable, "-c", "import distill; print(distill.code_version())"],
                         capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path / "pkg")})
    from distill import __version__

    assert out.stdout.strip() == __version__, out.stderr
