"""report.html, the per-question viewer: its data from the records, its escaping, and the page in a real browser.

The browser tests drive Debian's headless Chromium through selenium (the `dev` extra); on a machine without
chromium, chromedriver or selenium they skip and say which is missing.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from distill.report import question_scores, write_report
from distill.reporting.viewer import VIEWER, embed, markdown_html, viewer_data
from tests.test_report import rec, sample_run, write_run

HOSTILE = "</script><img src=x onerror=alert(1)>"
MANIFEST = {"methods": [{"name": n} for n in ("teacher", "student", "react", "direct")], "reference": "teacher",
            "bootstrap_samples": 100, "seed": 0}


def demo_shaped() -> dict[str, list[dict]]:
    """sample_run's four methods on twelve HotpotQA questions, plus one TriviaQA question for each."""
    runs = sample_run()
    for name, records in runs.items():
        kind = records[0]["kind"]
        records.append(rec(name, "t0", "Paris", "Paris", dataset="triviaqa", kind=kind, gold_hops=None,
                           steps=0 if kind == "direct" else 2))
    return runs


def page_data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="data">(.*?)</script>', html, re.S)
    return json.loads(found.group(1))


def test_embedded_json_cannot_close_its_script_tag():
    text = embed({"plan": HOSTILE, "note": "a <!-- b & c -->"})
    assert "<" not in text and ">" not in text and "&" not in text
    assert json.loads(text) == {"plan": HOSTILE, "note": "a <!-- b & c -->"}
    assert json.loads(embed({"x": float("nan")})) == {"x": None}  # JSON.parse rejects NaN: null instead


def test_report_writes_the_viewer_with_every_question_and_its_gold_marks(tmp_path):
    runs = demo_shaped()
    out = write_run(tmp_path, runs, MANIFEST)
    results = write_report(out)
    html = (out / VIEWER).read_text()
    assert "http://" not in html and "https://" not in html and "<link" not in html  # no CDN, no server
    data = page_data(html)
    assert data == json.loads(json.dumps(viewer_data(results, runs, question_scores)))
    assert data["reference"] == "teacher" and data["methods"] == ["teacher", "student", "react", "direct"]
    assert data["students"] == ["student"] and len(data["questions"]) == 13
    by_key = {q["key"]: q for q in data["questions"]}
    assert by_key["triviaqa:t0"]["gold"] == [] and by_key["hotpotqa:q0"]["gold"] == ["q0 page A", "q0 page B"]
    for r in runs["student"]:
        run = by_key[f"{r['dataset']}:{r['id']}"]["runs"]["student"]
        marked = [g for s in run["steps"] for g in s["gold"]]
        assert sorted(marked) == sorted((r.get("evidence_recall") or {}).get("found") or [])
        assert run["f1"] == question_scores(r)["f1"] and run["prediction"] == r["prediction"]
    worse = results["verdict"]["rows"]["student"]["questions"]["worse"]
    assert {k for k, o in data["outcomes"]["student"].items() if o == "worse"} == {f"{d}:{i}" for d, i in worse}
    report = (out / "report.md").read_text()
    assert f"[{worse[0][1]}](report.html#q={worse[0][1]})" in report  # the verdict links into the viewer


def test_a_hostile_record_stays_text_in_the_file(tmp_path):
    runs = {"teacher": [rec("teacher", "h", "x", "x")], "student": [rec("student", "h", HOSTILE, "x")]}
    runs["student"][0]["plan"]["steps"][0]["input"] = HOSTILE
    for records in runs.values():
        records[0]["question"] = HOSTILE
    out = write_run(tmp_path, runs, MANIFEST | {"methods": [{"name": "teacher"}, {"name": "student"}]})
    write_report(out)
    html = (out / VIEWER).read_text()
    assert HOSTILE not in html
    images = re.findall(r"<img[^>]*>", html)  # the report's plots, and nothing a record brought in
    assert images and all(re.fullmatch(r'<img src="[a-z_]+\.png" alt="[^"<>]*">', i) for i in images), images
    assert page_data(html)["questions"][0]["question"] == HOSTILE


def test_report_html_opens_with_the_reports_own_text_then_the_viewer(tmp_path):
    """One source: report.html shows report.md's verdict, provenance and tables (the same text, as HTML) above
    the questions, and report.md's links into the page land in it."""
    runs = sample_run()
    out = write_run(tmp_path, runs, MANIFEST)
    write_report(out)
    page = (out / VIEWER).read_text()
    report = (out / "report.md").read_text()
    assert page.index("<h2>Verdict</h2>") < page.index("<h2>Where these numbers come from</h2>") \
        < page.index("<h2>Accuracy</h2>") < page.index('<h2 id="viewer">Questions side by side</h2>')
    verdict_line = next(line for line in report.splitlines() if line.startswith("**student** against **teacher**"))
    assert markdown_html(verdict_line) in page  # the verdict sentence, rendered from report.md's own line
    assert "<strong>student</strong> against <strong>teacher</strong>" in page
    assert '<th>method</th><th>kind</th><th>planner prompt</th>' in page  # the accuracy table


def test_markdown_html_escapes_everything_and_follows_no_script_link():
    text = ("# Report <b>\n\n| method | note |\n|---|---|\n| <script>alert(1)</script> | **x** |\n\n"
            "- a [link](javascript:alert(1)) and [ok](report.html#q=a%20b)\n\n> **Warning:** `<i>`\n")
    out = markdown_html(text)
    assert "<script>" not in out and "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "<h1>Report &lt;b&gt;</h1>" in out and "<td><strong>x</strong></td>" in out
    assert 'href="javascript' not in out and '<a href="report.html#q=a%20b">ok</a>' in out
    assert "<blockquote><strong>Warning:</strong> <code>&lt;i&gt;</code></blockquote>" in out


def test_an_invalid_plan_is_never_a_win_in_the_verdict_or_the_page(tmp_path):
    """The student's plan failed to parse, yet its Solver answered right where the teacher's did not: no win."""
    runs = {"teacher": [rec("teacher", f"q{i}", "wrong", "Paris") for i in range(3)],
            "student": [rec("student", f"q{i}", "Paris", "Paris", valid=i != 0) for i in range(3)]}
    out = write_run(tmp_path, runs, MANIFEST | {"methods": [{"name": "teacher"}, {"name": "student"}]})
    results = write_report(out)
    assert results["verdict"]["rows"]["student"]["questions"]["better"] == [["hotpotqa", "q1"], ["hotpotqa", "q2"]]
    data = page_data((out / VIEWER).read_text())
    assert data["outcomes"]["student"] == {"hotpotqa:q1": "better", "hotpotqa:q2": "better"}
    assert data["questions"][0]["runs"]["student"]["valid"] is False


# ------------------------------------------------------------------------------------------- in a browser


def _browser():
    """(chromium, chromedriver) paths, or skip saying what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    chromium = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    driver = shutil.which("chromedriver")
    if chromium is None or driver is None:
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if p is None)
        pytest.skip(f"{missing} not found (Debian: apt-get install chromium chromium-driver)")
    return chromium, driver


@pytest.fixture(scope="module")
def browser():
    chromium, driver = _browser()
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    b = webdriver.Chrome(service=Service(driver), options=options)
    yield b
    b.quit()


def _rows(browser) -> list[str]:
    from selenium.webdriver.common.by import By

    return [tr.get_attribute("data-key") for tr in browser.find_elements(By.CSS_SELECTOR, "#questions tbody tr")]


@pytest.mark.slow
def test_the_viewer_in_a_real_browser(tmp_path, browser):
    from PIL import Image
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    runs = demo_shaped()
    out = write_run(tmp_path, runs, MANIFEST)
    results = write_report(out)
    browser.get((out / VIEWER).as_uri())
    assert len(_rows(browser)) == 13
    headers = [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#head th")]
    assert headers == ["id", "dataset", "question", "teacher (reference)", "student", "react", "direct"]

    # open a question: every method's plan side by side, gold pages marked where the evidence holds them
    question = next(r for r in runs["student"] if (r.get("evidence_recall") or {}).get("found"))
    browser.find_element(By.CSS_SELECTOR, f'tr[data-key="hotpotqa:{question["id"]}"]').click()
    columns = browser.find_elements(By.CSS_SELECTOR, "#runs .run")
    assert [c.get_attribute("data-method") for c in columns] == ["teacher", "student", "react", "direct"]
    assert len({c.location["y"] for c in columns}) == 1 and columns[0].location["x"] < columns[1].location["x"]
    student = columns[1]
    marks = [m.text for m in student.find_elements(By.CSS_SELECTOR, ".gold-mark")]
    assert marks == [f"gold: {g}" for g in question["evidence_recall"]["found"]]
    assert f"Solver: {question['prediction']}" in student.text
    assert browser.current_url.endswith(f"#q=hotpotqa%3A{question['id']}")

    # filters: a dataset, then the questions the student loses against the reference
    Select(browser.find_element(By.ID, "f-dataset")).select_by_value("triviaqa")
    assert _rows(browser) == ["triviaqa:t0"]
    Select(browser.find_element(By.ID, "f-dataset")).select_by_value("")
    Select(browser.find_element(By.ID, "f-outcome")).select_by_value("worse")
    worse = results["verdict"]["rows"]["student"]["questions"]["worse"]
    assert worse and _rows(browser) == [f"{d}:{i}" for d, i in sorted(map(tuple, worse))]
    Select(browser.find_element(By.ID, "f-method")).select_by_value("react")
    assert [th.text for th in browser.find_elements(By.CSS_SELECTOR, "#head th")][3:] == ["react"]

    # a link from report.md opens its question
    browser.get((out / VIEWER).as_uri() + f"#q={worse[0][1]}")
    assert browser.find_element(By.CSS_SELECTOR, "#detail h2").text == f"q {worse[0][1]}?"

    shot = tmp_path / "viewer.png"
    assert browser.save_screenshot(str(shot))
    colours = Image.open(shot).convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # not a blank page: text, tables, marks


@pytest.mark.slow
def test_a_hostile_record_renders_as_text_in_a_real_browser(tmp_path, browser):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    runs = {"teacher": [rec("teacher", "h", "x", "x")], "student": [rec("student", "h", HOSTILE, "x")]}
    student = runs["student"][0]
    student["plan"]["steps"][0]["input"] = HOSTILE
    for records in runs.values():
        records[0]["question"] = "<b id=injected>bold?</b>"
    student["evidence"][0]["output"] = "</pre><script>window.pwned = 1</script>"
    out = write_run(tmp_path, runs, MANIFEST | {"methods": [{"name": "teacher"}, {"name": "student"}]})
    write_report(out)
    browser.get((out / VIEWER).as_uri() + "#q=h")
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018
    # the only images are the report's own plots, files beside the page; none comes from a record
    sources = [img.get_attribute("src") for img in browser.find_elements(By.TAG_NAME, "img")]
    assert all(src.startswith(out.as_uri() + "/") and src.endswith(".png") for src in sources), sources
    assert browser.find_elements(By.ID, "injected") == []
    assert browser.execute_script("return window.pwned === undefined")
    column = browser.find_element(By.CSS_SELECTOR, '#runs .run[data-method="student"]')
    assert f"#E1 = Wikipedia[{HOSTILE}]" in column.find_element(By.CSS_SELECTOR, ".call").text
    assert "</pre><script>window.pwned = 1</script>" in column.find_element(By.CSS_SELECTOR, "pre.evidence").text
    assert f"Solver: {HOSTILE}" in column.text
    assert browser.find_element(By.CSS_SELECTOR, "#detail h2").text == "<b id=injected>bold?</b>"
