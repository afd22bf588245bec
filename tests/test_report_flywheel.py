"""`distill report` on a flywheel's output folder: its rounds side by side and the promotions log, from round files
written here (round 1 promoted, round 2 kept, then a rollback by hand). The cells are the numbers each round's
report.json holds; a bad report.json is one line naming it; text from the files is escaped in report.md and
report.html and kept to one printable line on the terminal."""

from __future__ import annotations

import copy
import html
import json
import re
from pathlib import Path


from distill import cli
from distill.reporting.flywheel_report import is_flywheel_dir, load_flywheel, round_dirs, round_table

AGENT = "http://127.0.0.1:8080"
START = "runs/demo/improve/student/round_1/adapter"

ROUND_1 = {
    "round": 1, "at": "2026-12-06T06:00:00Z", "from_round": 0, "adapter_in": START,
    "adapter": "runs/flywheel/round_1/adapter",
    "questions": {"with_feedback": 52, "new": 50, "train": 40, "heldout": 10, "left_out_eval": 2,
                  "sources": ["runs/agent/traces"]},
    "train": {"samples": 320, "kept": 31, "mean_reward": 0.61, "global_step": 3},
    "verdict": {"measure": "f1", "n": 10, "candidate": 0.62, "incumbent": 0.55, "diff": 0.07,
                "lo": 0.01, "hi": 0.13, "p_value": 0.03, "confidence": 0.95},
    "guards": {"plan_valid": {"incumbent": 0.9, "candidate": 0.92, "max_worse": 0.05, "ok": True},
               "tokens": {"incumbent": 310.0, "candidate": 290.5, "max_worse": 0.1, "ok": True},
               "duplicate_steps": {"incumbent": 0.2, "candidate": 0.1, "max_worse": 0.1, "ok": True}},
    "diversity": {"samples": 4, "incumbent": 1.8, "candidate": 2.1},
    "decision": "promote", "reason": "f1 better: the CI excludes 0 and every guard holds",
    "promoted_to": [AGENT],
    "cost": {"wall_s": {"questions": 1.2, "train": 95.0, "eval": 40.3, "diversity": 12.0, "total": 148.4},
             "tokens": 45678, "cost_usd": 0.0},
}
ROUND_2 = copy.deepcopy(ROUND_1) | {
    "round": 2, "at": "2026-12-06T07:00:00Z", "from_round": 1, "adapter_in": "runs/flywheel/round_1/adapter",
    "adapter": "runs/flywheel/round_2/adapter",
    "questions": {"with_feedback": 16, "new": 16, "train": 12, "heldout": 4, "left_out_eval": 0,
                  "sources": ["runs/agent/traces"]},
    "verdict": {"measure": "f1", "n": 4, "candidate": 0.6, "incumbent": 0.62, "diff": -0.02,
                "lo": -0.08, "hi": 0.04, "p_value": 0.52, "confidence": 0.95},
    "decision": "keep", "reason": "plan_valid worse: 0.920 -> 0.800 (max worse 0.05)", "promoted_to": [],
    "cost": {"wall_s": {"questions": 0.4, "train": 30.0, "eval": 16.0, "diversity": 5.0, "total": 51.6},
             "tokens": 12000, "cost_usd": 0.0},
}
ROUND_2["guards"] = copy.deepcopy(ROUND_1["guards"])
ROUND_2["guards"]["plan_valid"] = {"incumbent": 0.92, "candidate": 0.8, "max_worse": 0.05, "ok": False}


def line(at: str, action: str, round_: int, from_round: int, adapter: str, reason: str, agents: list[str],
         verdict: dict | None = None) -> dict:
    v = verdict or {}
    return {"at": at, "action": action, "round": round_, "from_round": from_round, "model": f"round_{round_}",
            "adapter": adapter, "measure": v.get("measure"), "diff": v.get("diff"), "lo": v.get("lo"),
            "hi": v.get("hi"), "reason": reason, "agents": agents}


PROMOTIONS = [
    line("2026-12-06T06:00:01Z", "promote", 1, 0, ROUND_1["adapter"], ROUND_1["reason"], [AGENT],
         ROUND_1["verdict"]),
    line("2026-12-06T07:00:01Z", "keep", 2, 1, ROUND_2["adapter"], ROUND_2["reason"], [], ROUND_2["verdict"]),
    line("2026-12-06T08:00:00Z", "rollback", 0, 1, START, "rolled back by hand", [AGENT]),
]


def flywheel(folder: Path, rounds=(ROUND_1, ROUND_2), promotions=PROMOTIONS) -> Path:
    for report in rounds:
        (folder / f"round_{report['round']}").mkdir(parents=True, exist_ok=True)
        (folder / f"round_{report['round']}" / "report.json").write_text(json.dumps(report))
    (folder / "promotions.jsonl").write_text("".join(json.dumps(p) + "\n" for p in promotions))
    return folder


def html_rows(page: str) -> dict[str, list[str]]:
    """The rounds table of report.html: row label -> cells, unescaped as a browser shows them."""
    table = re.search(r'<table class="rounds">(.*?)</table>', page, re.S).group(1)
    body = table.split("<tbody>")[1]
    return {html.unescape(label): [html.unescape(c) for c in re.findall(r"<td>(.*?)</td>", cells)]
            for label, cells in re.findall(r"<tr><th>(.*?)</th>(.*?)</tr>", body)}


def test_a_column_per_round_with_what_its_gate_read(tmp_path, capsys):
    folder = flywheel(tmp_path / "flywheel")
    assert cli.main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    rows = html_rows((folder / "report.html").read_text())
    assert rows["from round"] == ["0", "1"]
    assert rows["questions: train / held-out"] == ["40 / 10", "12 / 4"]
    assert rows["questions: with feedback / new / left out (eval sets)"] == ["52 / 50 / 2", "16 / 16 / 0"]
    assert rows["measure: candidate vs incumbent"] == ["f1: 0.620 vs 0.550",
                                                       "f1: 0.600 vs 0.620"]
    assert rows["Δ candidate − incumbent [CI]"] == ["+0.070 [+0.010, +0.130] (95%, p 0.030, n 10)",
                                                    "-0.020 [-0.080, +0.040] (95%, p 0.520, n 4)"]
    assert rows["guard plan_valid: incumbent → candidate"] == ["0.900 → 0.920, ok", "0.920 → 0.800, worse"]
    assert rows["guard tokens: incumbent → candidate"] == ["310.0 → 290.5, ok"] * 2
    assert rows["guard duplicate_steps: incumbent → candidate"] == ["0.200 → 0.100, ok"] * 2
    assert rows["diversity: incumbent → candidate"] == ["1.80 → 2.10 (4 samples)"] * 2
    assert rows["decision"] == ["promote", "keep"]
    assert rows["reason"] == [ROUND_1["reason"], "plan_valid worse: 0.920 -> 0.800 (max worse 0.05)"]
    assert rows["promoted to"] == [AGENT, "none"]
    assert rows["cost: wall s"] == ["148 (questions 1, train 95, eval 40, diversity 12)",
                                    "52 (questions 0, train 30, eval 16, diversity 5)"]
    assert rows["cost: tokens"] == ["45678", "12000"]
    assert "cost: $" not in rows  # local models cost $0: no row of zeros
    # the guards in the contract's order, the table's rows in the same order in report.md
    labels = list(rows)
    assert labels.index("guard plan_valid: incumbent → candidate") < labels.index(
        "guard tokens: incumbent → candidate") < labels.index("guard duplicate_steps: incumbent → candidate")
    markdown = (folder / "report.md").read_text()
    assert "| decision | promote | keep |" in markdown
    assert "| from round | 0 | 1 |" in markdown
    assert "round 2 from round 1: keep" in out and "in service: round 0" in out


def test_the_promotions_log_is_listed_oldest_first_and_names_the_adapter_in_service(tmp_path):
    folder = flywheel(tmp_path / "flywheel")
    cli.main(["report", str(folder)])
    page = (folder / "report.html").read_text()
    items = [html.unescape(i) for i in re.findall(r"<li>(.*?)</li>", page)]
    assert items == [
        f"2026-12-06T06:00:01Z: promote round 1 (from round 0): {ROUND_1['reason']}; agents: {AGENT}",
        f"2026-12-06T07:00:01Z: keep round 2 (from round 1): {ROUND_2['reason']}",
        f"2026-12-06T08:00:00Z: rollback round 0 (from round 1): rolled back by hand; agents: {AGENT}",
    ]
    # the last promote or rollback line says what serves: here the rollback to round 0's adapter
    assert html.unescape(re.search(r"In service: [^<]*", page).group(0)) == (
        f"In service: round 0 ({START}), since 2026-12-06T08:00:00Z (rollback).")
    data = load_flywheel(folder)
    assert data["in_service"]["round"] == 0 and data["in_service"]["adapter"] == START
    without_rollback = flywheel(tmp_path / "two", promotions=PROMOTIONS[:2])
    assert load_flywheel(without_rollback)["in_service"]["round"] == 1  # the keep line changes nothing


def test_a_bad_report_json_is_one_line_naming_it_and_writes_nothing(tmp_path, capsys):
    folder = flywheel(tmp_path / "flywheel")
    bad = folder / "round_2" / "report.json"
    for text in (json.dumps({k: v for k, v in ROUND_2.items() if k != "verdict"}),  # a field missing
                 json.dumps(ROUND_2 | {"decision": "maybe"}),  # a value the schema does not know
                 "{\"round\": 2, "):  # not JSON: a write cut short
        bad.write_text(text)
        assert cli.main(["report", str(folder)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
        assert str(bad) in err
        assert not (folder / "report.md").exists() and not (folder / "report.html").exists()


def test_a_round_file_in_the_wrong_folder_is_refused(tmp_path, capsys):
    folder = flywheel(tmp_path / "flywheel")
    (folder / "round_2" / "report.json").write_text(json.dumps(ROUND_2 | {"round": 3}))
    assert cli.main(["report", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "says round 3, but its folder is round_2" in err and err.count("\n") == 1


def test_text_from_the_files_is_escaped_in_the_page_and_the_markdown_and_one_line_on_the_terminal(tmp_path, capsys):
    # one line, as the readers require of a reason, but with a Unicode line separator and a terminal escape in it
    hostile = ("<script>alert(1)</script> [click](javascript:alert(1)) | cell **bold** `code`\u2028"
               "# heading \x1b[31mred")
    rounds = (ROUND_1, ROUND_2 | {"reason": hostile, "promoted_to": ["<img src=x onerror=alert(1)>"]})
    promotions = PROMOTIONS[:1] + [PROMOTIONS[1] | {"reason": hostile}]
    folder = flywheel(tmp_path / "flywheel", rounds, promotions)
    assert cli.main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    page = (folder / "report.html").read_text()
    assert "<script>" not in page and "<img" not in page and "<a " not in page and "href" not in page
    assert "<strong>" not in page and "<code>" not in page
    shown = "<script>alert(1)</script> [click](javascript:alert(1)) | cell **bold** `code` # heading [31mred"
    assert html_rows(page)["reason"][1] == shown  # one line, the escape character gone, every character shown
    markdown = (folder / "report.md").read_text()
    assert "<script>" not in markdown and "[click](" not in markdown and "**bold**" not in markdown
    assert r"\<script\>alert(1)\</script\> \[click\](javascript:alert(1)) \| cell \*\*bold\*\* \`code\`" \
        in markdown
    reason_row = next(r for r in markdown.splitlines() if r.startswith("| reason |"))
    assert len(re.findall(r"(?<!\\)\|", reason_row)) == 4  # the reason's own | does not open a cell
    assert "\x1b" not in out and "\x1b" not in markdown and "\x1b" not in page


def test_an_unfinished_round_is_a_column_that_says_so(tmp_path):
    folder = flywheel(tmp_path / "flywheel", rounds=(ROUND_1,), promotions=PROMOTIONS[:1])
    (folder / "round_2").mkdir()
    header, rows = round_table(load_flywheel(folder)["rounds"])
    assert header == ["", "round 1", "round 2"]
    assert dict(rows)["decision"] == ["promote", "unfinished (no report.json)"]
    assert dict(rows)["from round"] == ["0", "–"]


def test_rounds_in_numeric_order_and_what_is_a_flywheel_folder(tmp_path):
    for name in ("round_10", "round_9", "round_1", "round_0", "round_x", "round_01"):
        (tmp_path / name).mkdir()
    assert [n for n, _ in round_dirs(tmp_path)] == [1, 9, 10]  # round 0 is the config's adapter: no folder
    assert is_flywheel_dir(tmp_path)
    (tmp_path / "records").mkdir()
    assert not is_flywheel_dir(tmp_path)  # an evaluation folder stays an evaluation's report
    assert not is_flywheel_dir(tmp_path / "nowhere")


def test_intro_is_refused_for_a_flywheel_folder_and_out_writes_elsewhere(tmp_path, capsys):
    folder = flywheel(tmp_path / "flywheel")
    assert cli.main(["report", str(folder), "--intro", "demo"]) == 2
    assert "--intro" in capsys.readouterr().err
    out = tmp_path / "elsewhere"
    out.mkdir()
    assert cli.main(["report", str(folder), "--out", str(out)]) == 0
    assert (out / "report.md").is_file() and (out / "report.html").is_file()
    assert not (folder / "report.md").exists()
