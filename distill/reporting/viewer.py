"""report.html: the report (verdict, provenance, tables: report.md's own text) and then every question's plans side
by side, in one file that opens anywhere.

A table of numbers cannot show why a student lost a question; its plan can (a step such as
`Wikipedia[LLM[Lemoine] Wozniak]` is plain at a glance). The page is self-contained (inline CSS and script, the
records' data embedded as JSON, no server, no network), so it can be mailed or attached to a result.

Every string in it comes from a model, a dataset or a tool, so none is trusted: the data sits in a
`<script type="application/json">` with `<`, `>` and `&` written as JSON escapes (a plan holding `</script>`
cannot close the tag), and the page's script inserts all of it with `textContent`, never as HTML.
"""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from distill.core.metrics import evidence_recall

VIEWER = "report.html"


def _steps(rec: dict) -> list[dict]:
    """Plan steps joined with their evidence by id; evidence no plan step names (ReAct actions, re-plans) after."""
    gold = (rec.get("evidence_recall") or {}).get("gold") or []
    evidence = {e.get("id"): e for e in rec.get("evidence") or []}
    plan = (rec.get("plan") or {}).get("steps") or []
    thoughts = {s.get("evidence_id"): s.get("thought") for s in (rec.get("react") or {}).get("steps") or []
                if isinstance(s, dict)}
    rows = [{"id": s.get("id"), "description": s.get("description"), "tool": s.get("tool"), "input": s.get("input"),
             "evidence": evidence.pop(s.get("id"), None)} for s in plan]
    rows += [{"id": e.get("id"), "description": thoughts.get(e.get("id")), "tool": e.get("tool"),
              "input": e.get("input"), "evidence": e} for e in evidence.values()]
    for row in rows:
        ev = row.pop("evidence")
        row["output"] = ev.get("output") if ev else None
        row["status"] = ev.get("status") if ev else "not run"
        row["error"] = ev.get("error") if ev else None
        row["gold"] = (evidence_recall(gold, [ev]) or {}).get("found", []) if ev and gold else []
    return rows


def _run(rec: dict, scores: Mapping[str, Any]) -> dict:
    plan = rec.get("plan") or {}
    return {
        "kind": rec["kind"],
        "prompt": rec.get("planner_prompt"),
        "valid": plan.get("valid"),
        "errors": [{"code": e.get("code"), "step": e.get("step"), "message": e.get("message")}
                   for e in plan.get("errors") or []],
        # the raw text only where the plan failed to parse: the steps say the rest, and the file stays small
        "planner_output": (rec.get("planner") or {}).get("output") if plan.get("valid") is False else None,
        "steps": _steps(rec),
        "prediction": rec.get("prediction"),
        "tokens": (rec.get("tokens") or {}).get("total"),
        "wall_s": rec.get("wall_s"),
        **scores,
    }


def viewer_data(results: Mapping[str, Any], by_method: Mapping[str, list[dict]],
                scores: Callable[[dict], Mapping[str, Any]]) -> dict:
    """What the page shows: per question, each method's run; per student, the questions it wins and loses
    against the reference (from the verdict, so the page and report.md agree). `scores(rec)`: the report's
    EM/F1/recall of a record."""
    methods = [m for m in results["methods"] if m in by_method]
    questions: dict[tuple, dict] = {}
    for m in methods:
        for rec in by_method[m]:
            key = (rec["dataset"], rec["id"])
            q = questions.setdefault(key, {
                "key": f"{rec['dataset']}:{rec['id']}", "id": rec["id"], "dataset": rec["dataset"],
                "question": rec.get("question"), "answers": rec.get("answers") or [],
                "gold": (rec.get("evidence_recall") or {}).get("gold") or [], "runs": {}})
            q["gold"] = q["gold"] or (rec.get("evidence_recall") or {}).get("gold") or []
            q["runs"][m] = _run(rec, scores(rec))
    outcomes = {m: {f"{k[0]}:{k[1]}": word for word in ("better", "worse") for k in row["questions"][word]}
                for m, row in ((results.get("verdict") or {}).get("rows") or {}).items()}
    return {"reference": results["reference"], "methods": methods, "students": list(outcomes),
            "outcomes": outcomes, "questions": [questions[k] for k in sorted(questions)]}


_INLINE = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]*)\)|`([^`]+)`|\*\*(.+?)\*\*|\*([^*\s][^*]*)\*")


def _href(url: str) -> str | None:
    """A link the page may follow: relative (a plot, report.html#q=...) or http(s); nothing else (javascript:)."""
    scheme = re.match(r"^([a-zA-Z][a-zA-Z0-9+.-]*):", url)
    return url if scheme is None or scheme.group(1).lower() in ("http", "https") else None


def _inline(text: str) -> str:
    """Links, images, code, bold and emphasis of one line of report.md; every other character escaped."""
    out, at = [], 0
    for m in _INLINE.finditer(text):
        out.append(html.escape(text[at:m.start()]))
        at = m.end()
        bang, label, url, code, bold, em = m.groups()
        if url is not None or label is not None:
            href = _href(url or "")
            if href is None:
                out.append(html.escape(m.group(0)))
            elif bang:
                out.append(f'<img src="{html.escape(href)}" alt="{html.escape(label)}">')
            else:
                out.append(f'<a href="{html.escape(href)}">{_inline(label)}</a>')
        elif code is not None:
            out.append(f"<code>{html.escape(code)}</code>")
        elif bold is not None:
            out.append(f"<strong>{_inline(bold)}</strong>")
        else:
            out.append(f"<em>{_inline(em)}</em>")
    return "".join(out) + html.escape(text[at:])


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def markdown_html(text: str) -> str:
    """report.md as HTML, for the top of report.html: the one text the report writes, shown twice, never written
    twice. Only what report.md uses (headings, paragraphs, lists, quotes, tables, links, images, code, bold and
    emphasis); the strings in it come from models and datasets, so each is escaped."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
        elif heading := re.match(r"^(#{1,4}) (.*)$", line):
            level = len(heading.group(1))
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            i += 1
        elif line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            body = [r for r in rows[1:] if not all(re.fullmatch(r":?-+:?", c) for c in r)]
            head = "".join(f"<th>{_inline(c)}</th>" for c in rows[0])
            cells = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
            out.append(f"<table class=\"report\"><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>")
        elif line.startswith("- "):
            items = []
            while i < len(lines) and lines[i].startswith("- "):
                items.append(f"<li>{_inline(lines[i][2:])}</li>")
                i += 1
            out.append("<ul>" + "".join(items) + "</ul>")
        elif line.startswith(">"):
            quoted = []
            while i < len(lines) and lines[i].startswith(">"):
                quoted.append(_inline(lines[i].lstrip(">").strip()))
                i += 1
            out.append("<blockquote>" + "<br>".join(quoted) + "</blockquote>")
        else:
            para = []
            while i < len(lines) and lines[i].strip() and not re.match(r"^(#{1,4} |\||- |>)", lines[i]):
                para.append(_inline(lines[i]))
                i += 1
            out.append("<p>" + "\n".join(para) + "</p>")
    return "\n".join(out)


def _finite(value: Any) -> Any:
    """NaN and infinities as null: the browser's JSON.parse rejects them, and the page would show nothing."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def embed(data: Any) -> str:
    """JSON safe inside a <script> element: no `<`, `>` or `&` left to end the element or open a comment."""
    text = json.dumps(_finite(data), ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def render(data: Mapping[str, Any], report: str = "", intro: str | None = None) -> str:
    """The page: `report` (report.md's text) first, as HTML, then the viewer over `data`. `intro`: the part of
    the report that is its intro, whose paragraphs are marked as such."""
    body = markdown_html(report)
    for block in markdown_html(intro or "").split("\n"):
        if block.startswith("<p>"):
            body = body.replace(block, '<p class="intro">' + block[3:], 1)
    head, rest = PAGE.split("__REPORT__")  # split, not replaced in turn: a model's text may hold either marker
    middle, tail = rest.split("__DATA__")
    return head + body + middle + embed(data) + tail


def write_viewer(path: str | Path, results: Mapping[str, Any], by_method: Mapping[str, list[dict]],
                 scores: Callable[[dict], Mapping[str, Any]], report: str = "", intro: str | None = None) -> None:
    Path(path).write_text(render(viewer_data(results, by_method, scores), report, intro), encoding="utf-8")


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>distill: evaluation report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 1.5rem; color: #222; background: #fff; }
h1 { font-size: 1.3rem; margin: 0 0 .5rem; }
#filters { display: flex; gap: 1rem; flex-wrap: wrap; margin: .5rem 0 1rem; }
#filters label { display: flex; gap: .3rem; align-items: center; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; position: sticky; top: 0; }
#questions tbody tr { cursor: pointer; }
#questions td:first-child { white-space: nowrap; } #questions td:nth-child(3) { min-width: 18rem; }
#questions tbody tr:hover { background: #eef4ff; }
.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
.better { color: #096; font-weight: 600; } .worse { color: #c30; font-weight: 600; }
#detail { border: 1px solid #bbb; border-radius: 6px; padding: .8rem; margin: 1rem 0; background: #fafafa; }
#detail[hidden] { display: none; }
#runs { display: flex; gap: .8rem; overflow-x: auto; align-items: flex-start; }
.run { flex: 0 0 22rem; border: 1px solid #ccc; border-radius: 6px; padding: .5rem; background: #fff; }
.run h3 { margin: 0 0 .3rem; font-size: 1rem; }
.step { border-left: 3px solid #ccc; padding: .2rem .4rem; margin: .4rem 0; }
.step.has-gold { border-left-color: #d4a000; background: #fff8e0; }
.call { font-family: ui-monospace, monospace; word-break: break-word; }
.gold-mark { display: inline-block; background: #d4a000; color: #fff; border-radius: 3px; padding: 0 4px;
             font-size: 12px; margin-left: .3rem; }
pre { white-space: pre-wrap; word-break: break-word; margin: .2rem 0; font-size: 12px; max-height: 12rem;
      overflow: auto; background: #f6f6f6; padding: .3rem; }
.invalid { color: #c30; } .err { color: #c30; font-size: 12px; }
.muted { color: #777; }
.intro { max-width: 60rem; }
#report { max-width: 72rem; margin-bottom: 2rem; } #report table { width: auto; margin: .5rem 0 1rem; }
#report th { position: static; } #report img { max-width: 100%; } #report h2 { margin-top: 1.5rem; }
#report blockquote { border-left: 4px solid #c30; margin: .5rem 0; padding: .3rem .8rem; background: #fff4f0; }
</style></head>
<body>
<section id="report">
__REPORT__
</section>
<h2 id="viewer">Questions side by side</h2>
<p class="muted" id="summary"></p>
<div id="filters">
  <label>method <select id="f-method"><option value="">all</option></select></label>
  <label>dataset <select id="f-dataset"><option value="">all</option></select></label>
  <label>outcome <select id="f-outcome"><option value="">all</option></select></label>
  <span id="shown" class="muted"></span>
</div>
<section id="detail" hidden></section>
<table id="questions"><thead><tr id="head"></tr></thead><tbody></tbody></table>
<script type="application/json" id="data">__DATA__</script>
<script>
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const $ = (id) => document.getElementById(id);
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}
const fmt = (x, d = 2) =>
  (x === null || x === undefined) ? "\\u2013" : (typeof x === "number" ? x.toFixed(d) : String(x));
function option(select, value, label) { select.appendChild(el("option", {value: value}, label)); }

const errorCodes = new Set();
for (const q of DATA.questions) for (const r of Object.values(q.runs)) {
  for (const e of r.errors) if (e.code) errorCodes.add(e.code);
  for (const c of runCodes(r)) errorCodes.add(c);
}
for (const m of DATA.methods) option($("f-method"), m, m);
for (const d of [...new Set(DATA.questions.map((q) => q.dataset))]) option($("f-dataset"), d, d);
option($("f-outcome"), "better", "student better than " + DATA.reference);
option($("f-outcome"), "worse", "student worse than " + DATA.reference);
option($("f-outcome"), "invalid", "invalid plan");
for (const c of [...errorCodes].sort()) option($("f-outcome"), "code:" + c, "error: " + c);

function runCodes(r) {
  const failed = r.steps.filter((s) => s.status && s.status !== "ok" && s.status !== "not run");
  return r.errors.map((e) => e.code).filter((c) => c).concat(failed.map((s) => "step " + s.status));
}
function matches(q, method, dataset, outcome) {
  if (dataset && q.dataset !== dataset) return false;
  if (!outcome) return true;
  const names = method ? [method] : Object.keys(q.runs);
  if (outcome === "better" || outcome === "worse") {
    const students = method ? [method] : DATA.students;
    return students.some((s) => (DATA.outcomes[s] || {})[q.key] === outcome);
  }
  if (outcome === "invalid") return names.some((m) => q.runs[m] && q.runs[m].valid === false);
  const code = outcome.slice(5);
  return names.some((m) => q.runs[m] && runCodes(q.runs[m]).includes(code));
}
function shownMethods() { const m = $("f-method").value; return m ? [m] : DATA.methods; }

function drawTable() {
  const methods = shownMethods(), head = $("head");
  head.replaceChildren(el("th", {}, "id"), el("th", {}, "dataset"), el("th", {}, "question"),
    ...methods.map((m) => el("th", {}, m + (m === DATA.reference ? " (reference)" : ""))));
  const body = document.querySelector("#questions tbody");
  body.replaceChildren();
  let n = 0;
  for (const q of DATA.questions) {
    if (!matches(q, $("f-method").value, $("f-dataset").value, $("f-outcome").value)) continue;
    n += 1;
    const cells = methods.map((m) => {
      const r = q.runs[m];
      if (!r) return el("td", {class: "num muted"}, "\\u2013");
      const o = (DATA.outcomes[m] || {})[q.key];
      const td = el("td", {class: "num" + (o ? " " + o : "")}, "F1 " + fmt(r.f1) + " \\u00b7 R " + fmt(r.recall));
      if (r.valid === false) td.appendChild(el("span", {class: "invalid"}, " \\u00b7 invalid"));
      return td;
    });
    const tr = el("tr", {"data-key": q.key}, el("td", {}, q.id), el("td", {}, q.dataset),
                  el("td", {}, q.question || ""), ...cells);
    tr.addEventListener("click", () => { location.hash = "q=" + encodeURIComponent(q.key); });
    body.appendChild(tr);
  }
  $("shown").textContent = n + " of " + DATA.questions.length + " questions";
}

function drawRun(m, r) {
  const box = el("div", {class: "run", "data-method": m});
  box.appendChild(el("h3", {}, m + (m === DATA.reference ? " (reference)" : "")));
  const o = (DATA.outcomes[m] || {})[currentKey];
  box.appendChild(el("div", {class: "muted"}, r.kind + (r.prompt ? ", prompt " + r.prompt : "") +
    (r.valid === false ? "" : (r.valid ? ", plan valid" : "")),
    r.valid === false ? el("span", {class: "invalid"}, ", plan invalid") : null,
    o ? el("span", {class: o}, " \\u00b7 " + o + " than " + DATA.reference) : null));
  for (const e of r.errors) {
    const where = e.step ? " at " + e.step : "";
    box.appendChild(el("div", {class: "err"}, (e.code || "") + where + ": " + (e.message || "")));
  }
  for (const s of r.steps) {
    const step = el("div", {class: "step" + (s.gold.length ? " has-gold" : "")});
    if (s.description) step.appendChild(el("div", {}, s.description));
    step.appendChild(el("div", {class: "call"}, (s.id || "") + " = " + (s.tool || "") + "[" + (s.input || "") + "]"));
    for (const g of s.gold) {
      step.appendChild(el("span", {class: "gold-mark", title: "gold supporting page"}, "gold: " + g));
    }
    if (s.status !== "ok") step.appendChild(el("div", {class: "err"}, s.status + (s.error ? ": " + s.error : "")));
    if (s.output !== null && s.output !== undefined) step.appendChild(el("pre", {class: "evidence"}, s.output));
    box.appendChild(step);
  }
  if (r.valid === false && r.planner_output) {
    const raw = el("pre", {class: "raw"}, r.planner_output);
    box.appendChild(el("details", {}, el("summary", {}, "planner output"), raw));
  }
  const answer = r.prediction === null ? "(no answer)" : String(r.prediction);
  box.appendChild(el("div", {class: "answer"}, el("b", {}, "Solver: "), answer));
  box.appendChild(el("div", {class: "num"}, "EM " + fmt(r.em, 0) + " \\u00b7 F1 " + fmt(r.f1) + " \\u00b7 recall " +
    fmt(r.recall) + " \\u00b7 " + fmt(r.tokens, 0) + " tok \\u00b7 " + fmt(r.wall_s) + " s"));
  return box;
}

let currentKey = null;
function drawDetail() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("method") && DATA.methods.includes(params.get("method"))) $("f-method").value = params.get("method");
  const want = params.get("q");
  const q = want === null ? null
    : (DATA.questions.find((x) => x.key === want) || DATA.questions.find((x) => x.id === want));
  const box = $("detail");
  if (!q) { box.hidden = true; currentKey = null; return; }
  currentKey = q.key;
  const gold = q.gold.length ? q.gold.join("; ") : "none recorded";
  box.replaceChildren(el("h2", {}, q.question || q.id),
    el("div", {class: "muted"}, q.dataset + " \\u00b7 " + q.id + " \\u00b7 gold answer: " + q.answers.join(" | ") +
       " \\u00b7 gold pages: " + gold),
    el("div", {id: "runs"}, ...DATA.methods.filter((m) => q.runs[m]).map((m) => drawRun(m, q.runs[m]))));
  box.hidden = false;
  box.scrollIntoView();
}

$("summary").textContent = DATA.questions.length + " questions, " + DATA.methods.length + " methods; reference: " +
  DATA.reference + ". Cells: F1 and evidence recall (R); a student's cell is coloured where it is better or worse " +
  "than the reference on F1 (then recall). Click a row to see every method's plan, evidence and answer.";
for (const id of ["f-method", "f-dataset", "f-outcome"]) $(id).addEventListener("change", drawTable);
window.addEventListener("hashchange", () => { drawDetail(); drawTable(); });
drawDetail();
drawTable();
</script>
</body></html>
"""
