"""Hostile bytes at the command line: `distill score` and `distill plan check` answer with one line and exit 2.

The subprocess tests run the real CLI the way a user does, so a traceback anywhere (the text layer of stdin
included) would show up on stderr.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from distill import cli
from distill.core.store import read_jsonl

GOOD = json.dumps({"id": "q1", "prediction": "Paris", "answers": ["Paris"]}).encode()


def _run(*argv: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONIOENCODING="utf-8")  # a strict text layer, as on most terminals
    return subprocess.run(
        [sys.executable, "-m", "distill.cli", *argv], input=stdin, capture_output=True, timeout=120, env=env
    )


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    err = proc.stderr.decode("utf-8", "replace")
    assert proc.returncode == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")
    return err


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b'{"prediction": "caf\xe9", "answers": ["x"]}', "p.jsonl:2: not UTF-8 text"),
        (b"\xff\xfe{}", "p.jsonl:2: not UTF-8 text"),
        (b'{"prediction": "x", "answers": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
         "p.jsonl:2: JSON nested too deeply"),
        (b'{"a": ' * 500_000, "p.jsonl:2: JSON nested too deeply"),
    ],
)
def test_score_bad_bytes_and_deep_nesting_are_one_line(tmp_path, capsys, line, message):
    src = tmp_path / "p.jsonl"
    src.write_bytes(GOOD + b"\n" + line + b"\n")
    assert cli.main(["score", "--dataset", "hotpotqa", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1


def test_score_bad_bytes_through_the_real_cli(tmp_path):
    src = tmp_path / "p.jsonl"
    src.write_bytes(GOOD + b"\n" + b"[" * 100_000 + b"\n")
    assert "p.jsonl:2: JSON nested too deeply" in _one_error_line(_run("score", "--dataset", "hotpotqa", str(src)))


def test_score_out_may_overwrite_its_input_and_leaves_no_temp_file(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    # U+2028 inside a prediction: a reader splitting on Unicode line breaks would see two broken lines.
    rows = [{"id": "q1", "prediction": "Par\u2028is", "answers": ["Paris"]}, {"id": "q2", "prediction": None,
                                                                              "answers": "x"}]
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert cli.main(["score", "--dataset", "hotpotqa", str(src), "--out", str(src)]) == 0
    scored = read_jsonl(src)
    assert [r["id"] for r in scored] == ["q1", "q2"] and [r["prediction"] for r in scored] == ["Par\u2028is", None]
    assert all(set(r) >= {"em", "f1"} for r in scored)
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl"]
    assert "n=2" in capsys.readouterr().out


def test_score_out_that_cannot_be_written_is_one_line(tmp_path, capsys):
    src = tmp_path / "p.jsonl"
    src.write_bytes(GOOD + b"\n")
    assert cli.main(["score", "--dataset", "hotpotqa", str(src), "--out", str(src / "x.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot write {src / 'x.jsonl'}")


@pytest.mark.parametrize("data", [b"Plan: caf\xe9\n#E1 = LLM[x]\n", b"\xff\xfe#\x00E\x001\x00", b"#E1 = LLM[\xc3]"])
def test_plan_check_non_utf8_stdin_is_one_line(data):
    err = _one_error_line(_run("plan", "check", "-", stdin=data))
    assert err.startswith("error: plan on stdin is not UTF-8 text")


def test_plan_check_stdin_keeps_working_for_text_and_crlf():
    proc = _run("plan", "check", "-", "--json", stdin="Plan: look up café\r\n#E1 = Wikipedia[café]\r\n".encode())
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert plan["valid"] and plan["steps"][0]["input"] == "café"
