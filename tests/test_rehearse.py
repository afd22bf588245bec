"""The rehearsal of the documented commands (scripts/rehearse.py, `make rehearse`): every command of README.md,
docs/*.md and the configs' headers is either run, with the substitutions of its one table, or listed there with
the reason it is not; a command added to the docs without either fails here. The slow test runs the rehearsal
itself: each rehearsed command must exit as the table says and leave what the next one reads."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("rehearse", ROOT / "scripts" / "rehearse.py")
rehearse = importlib.util.module_from_spec(spec)
sys.modules["rehearse"] = rehearse  # its dataclasses look their module up
spec.loader.exec_module(rehearse)


def test_every_documented_command_is_rehearsed_or_listed_with_its_reason():
    assert not rehearse.uncovered(), "\n".join(["not rehearsed and not in scripts/rehearse.py's table:",
                                                *rehearse.uncovered()])


def test_a_command_added_to_the_docs_without_a_row_is_caught(tmp_path, monkeypatch):
    page = tmp_path / "new-page.md"
    page.write_text("Try it:\n\n```bash\ndistill frobnicate --config configs/frobnicate.yaml   # new\n```\n")
    monkeypatch.setattr(rehearse, "ROOT", tmp_path)
    monkeypatch.setattr(rehearse, "PAGES", [page])
    assert rehearse.uncovered() == ["new-page.md block 0: distill frobnicate --config configs/frobnicate.yaml"]


def test_the_parser_reads_blocks_headers_continuations_and_heredocs(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("```bash\nmake demo   # first\naccelerate launch --num_processes 8 \\\n    -m distill.train\n"
                    "python - <<'EOF'\nprint(1)\nEOF\n```\n```text\nfilter: done\n```\n")
    config = tmp_path / "c.yaml"
    config.write_text("# distill eval --config c.yaml   (after: something)\n# make demo-full: prose\nkey: 1\n")
    monkeypatch.setattr(rehearse, "ROOT", tmp_path)
    monkeypatch.setattr(rehearse, "PAGES", [page, config])
    blocks = rehearse.documented_blocks()
    assert [(b.where, b.commands) for b in blocks] == [
        ("page.md block 0", ["make demo", "accelerate launch --num_processes 8 -m distill.train",
                             "python - <<'EOF'\nprint(1)\nEOF"]),
        ("c.yaml header", ["distill eval --config c.yaml"])]


def test_the_table_page_names_every_row_reason_kind():
    text = (ROOT / "docs" / "rehearsal.md").read_text()
    assert "make rehearse" in text and "scripts/rehearse.py" in text


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("DISTILL_REHEARSE"),
                    reason="the whole rehearsal (about 15 minutes, a vLLM server and 2-process trainings of its own) "
                           "runs as `make rehearse`; DISTILL_REHEARSE=1 runs it here. Beside the rest of the suite on "
                           "2 workers it took the machine's 24 GiB")
def test_the_rehearsal_runs_every_rehearsed_command(tmp_path):
    outcomes = rehearse.rehearse(tmp_path, log=lambda *_: None)
    bad = rehearse.failures(outcomes)
    assert not bad, rehearse.table(bad) + f"\n(log: {(tmp_path / 'rehearsal.log').read_text()[-3000:]})"
    assert sum(o.rc is not None for o in outcomes) >= 10
    # what the README's chain reads from each step is there
    assert (tmp_path / "runs" / "qwen" / "adapter" / "adapter_model.safetensors").exists()
    assert (tmp_path / "runs" / "eval_hotpot_trivia_7b" / "report.md").exists()
    assert (tmp_path / "runs" / "teacher_gpt4o-mini" / "kept.jsonl").read_text().strip()
