"""The flywheel's rounds side by side: `distill report FLYWHEEL_DIR` writes report.md and report.html there.

A round's decision rests on several numbers at once (the measure's paired difference and its CI, each guard,
diversity, what it cost); one column per round shows what moved from one round to the next and why one was
promoted and the next kept, and the promotions log below it says which adapter served when. Nothing is
recomputed: each round's report.json is what its gate read, and the files are read through distill.flywheel's own
readers, so this page and the flywheel agree on one schema.

Every text shown here comes from a file a round wrote, and a reason can quote model-adjacent text, so none of it
is trusted: report.md backslash-escapes the characters Markdown reads as markup (a reason cannot become a link or
a table cell), report.html escapes every one and interprets none, and the terminal gets printable characters on
one line.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any, Callable

from distill.core import layout
from distill.core.errors import DistillError, one_line
from distill.core.store import replace_files
from distill.flywheel import read_promotions, read_round_report

REPORT_JSON = "report.json"  # in each round_<r>/ (the contract's name; distill.flywheel writes it)
PROMOTIONS = "promotions.jsonl"  # at the flywheel folder's root
ROUND_DIR = re.compile(r"round_([1-9][0-9]{0,8})")  # round 0 is the config's adapter: it has no folder
GUARDS = ("plan_valid", "tokens", "duplicate_steps")  # the contract's order; any other guard after, by name
ROUND_COLUMNS = 12  # the latest rounds side by side; wider than this a table is no longer read across
PROMOTION_LINES = 50  # the latest lines of the promotions log; the file keeps them all
TEXT_LIMIT = 500  # characters of one text from a file (a reason, a path), so one line cannot swamp the page


# ------------------------------------------------------------------------------------------- reading


def round_dirs(folder: str | Path) -> list[tuple[int, Path]]:
    """The round folders (`round_<r>`, r >= 1) in round order, by number: round_10 comes after round_9."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if p.is_dir() and (m := ROUND_DIR.fullmatch(p.name))]
    return sorted(found)


def is_flywheel_dir(folder: str | Path) -> bool:
    """A flywheel's output folder: a promotions log or round folders, and no evaluation records of its own (an
    evaluation folder stays an evaluation's report whatever else sits in it)."""
    folder = Path(folder)
    if (folder / layout.RECORDS_DIR).is_dir():
        return False
    return (folder / PROMOTIONS).is_file() or bool(round_dirs(folder))


def _dump(value: Any) -> Any:
    """A reader's pydantic model as plain JSON values (dates as ISO text), a dict or list as it is."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [_dump(v) for v in value]
    return value


def _read(reader: Callable[[Path], Any], path: Path) -> Any:
    """`reader(path)` as plain values; any refusal of the file is one line that names it."""
    try:
        return _dump(reader(path))
    except DistillError as exc:
        text = one_line(exc)
        raise DistillError(text if str(path) in text else f"{path}: {text}") from None
    except (ValueError, TypeError, KeyError) as exc:  # a schema error (pydantic's is a ValueError), bad JSON
        raise DistillError(f"{path}: {one_line(exc)}") from None


def load_flywheel(folder: str | Path) -> dict:
    """Every round's report.json (None for a round folder without one: an attempt that is running or died) and
    the promotions log, checked by distill.flywheel's readers before anything is shown."""
    folder = Path(folder)
    rounds = []
    for number, path in round_dirs(folder):
        report = None
        if (path / REPORT_JSON).is_file():
            report = _read(read_round_report, path / REPORT_JSON)
            if report.get("round") != number:
                raise DistillError(f"{path / REPORT_JSON}: says round {report.get('round')!r}, but its folder is "
                                   f"{path.name}")
        rounds.append({"round": number, "folder": path.name, "report": report})
    log = folder / PROMOTIONS
    promotions = _read(read_promotions, log) if log.is_file() else []
    if not rounds and not promotions:
        raise DistillError(f"{folder}: no round_<r>/ folder and no promotions.jsonl; run `distill flywheel` first")
    return {"folder": str(folder), "rounds": rounds, "promotions": promotions, "in_service": in_service(promotions)}


def in_service(promotions: list[dict]) -> dict:
    """The adapter in service: the last promote or rollback line's round and adapter; none -> round 0, the
    config's adapter (the contract's rule, read here as the flywheel reads it)."""
    for line in reversed(promotions):
        if line.get("action") in ("promote", "rollback"):
            return {"round": line.get("round"), "adapter": line.get("adapter"), "since": line.get("at"),
                    "action": line.get("action")}
    return {"round": 0, "adapter": None, "since": None, "action": None}


# ------------------------------------------------------------------------------------------- cells


def plain(value: Any, limit: int = TEXT_LIMIT) -> str:
    """A text from a file on one line, printable characters only (no terminal escape, no line break), bounded."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def num(value: Any, digits: int = 3) -> str:
    """A number as the tables show it: "–" when missing, ints whole, large floats with one decimal."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.{digits}f}"
    return plain(value)


def signed(value: Any, digits: int = 3) -> str:
    return "–" if not isinstance(value, (int, float)) else f"{value:+.{digits}f}"


def diff_cell(v: dict) -> str:
    """`+0.070 [+0.010, +0.130] (95%, p 0.030, n 40)`: the paired difference, its CI and what it rests on."""
    confidence = v.get("confidence")
    level = f"{confidence * 100:g}%" if isinstance(confidence, (int, float)) else "–"
    return (f"{signed(v.get('diff'))} [{signed(v.get('lo'))}, {signed(v.get('hi'))}] "
            f"({level}, p {num(v.get('p_value'))}, n {num(v.get('n'))})")


def guard_cell(g: dict | None) -> str:
    if not g:
        return "–"
    return f"{num(g.get('incumbent'))} → {num(g.get('candidate'))}, {'ok' if g.get('ok') else 'worse'}"


def guard_names(reports: list[dict]) -> list[str]:
    names = {name for r in reports for name in (r.get("guards") or {})}
    return [g for g in GUARDS if g in names] + sorted(names - set(GUARDS))


def round_table(rounds: list[dict]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """(header, rows): a column per round, a row per thing the gate read or the round cost. Cells are plain
    text, not yet escaped for either format."""
    header = ["", *(f"round {r['round']}" for r in rounds)]
    reports = [r["report"] for r in rounds]
    done = [rep for rep in reports if rep]

    def row(label: str, cell: Callable[[dict], str]) -> tuple[str, list[str]]:
        return label, [cell(rep) if rep else "–" for rep in reports]

    rows = [
        row("from round", lambda rep: num(rep.get("from_round"))),
        row("at", lambda rep: plain(rep.get("at"))),
        row("questions: train / held-out", lambda rep: f"{num(rep['questions'].get('train'))} / "
                                                        f"{num(rep['questions'].get('heldout'))}"),
        row("questions: with feedback / new / left out (eval sets)",
            lambda rep: " / ".join(num(rep["questions"].get(k)) for k in ("with_feedback", "new", "left_out_eval"))),
        row("trained on: kept / samples", lambda rep: f"{num(rep['train'].get('kept'))} / "
                                                       f"{num(rep['train'].get('samples'))}"),
        row("measure: candidate vs incumbent", lambda rep: f"{plain(rep['verdict'].get('measure'))}: "
                                                            f"{num(rep['verdict'].get('candidate'))} vs "
                                                            f"{num(rep['verdict'].get('incumbent'))}"),
        row("Δ candidate − incumbent [CI]", lambda rep: diff_cell(rep["verdict"])),
    ]
    for name in guard_names(done):
        rows.append(row(f"guard {plain(name)}: incumbent → candidate",
                        lambda rep, name=name: guard_cell((rep.get("guards") or {}).get(name))))
    rows += [
        row("diversity: incumbent → candidate", lambda rep: f"{num(rep['diversity'].get('incumbent'), 2)} → "
                                                             f"{num(rep['diversity'].get('candidate'), 2)} "
                                                             f"({num(rep['diversity'].get('samples'))} samples)"),
        ("decision", [plain(rep["decision"]) if rep else "unfinished (no report.json)" for rep in reports]),
        row("reason", lambda rep: plain(rep.get("reason"))),
        row("adapter", lambda rep: plain(rep.get("adapter")) if rep.get("adapter") else "–"),
        row("promoted to", lambda rep: ", ".join(plain(u) for u in rep.get("promoted_to") or []) or "none"),
        row("cost: wall s", lambda rep: _wall(rep["cost"].get("wall_s") or {})),
        row("cost: tokens", lambda rep: num(rep["cost"].get("tokens"))),
    ]
    if any((rep.get("cost") or {}).get("cost_usd") for rep in done):  # local models cost $0: no column of zeros
        rows.append(row("cost: $", lambda rep: f"${rep['cost'].get('cost_usd') or 0.0:.4f}"))
    return header, rows


def _wall(wall: dict) -> str:
    parts = ", ".join(f"{k} {wall[k]:.0f}" for k in ("questions", "train", "eval", "diversity")
                      if isinstance(wall.get(k), (int, float)))
    total = wall.get("total")
    return (f"{total:.0f}" if isinstance(total, (int, float)) else "–") + (f" ({parts})" if parts else "")


def promotion_line(p: dict) -> str:
    """`AT: promote round 2 (from round 1): REASON; agents: URL, ...` as plain text."""
    agents = p.get("agents") or []
    switched = f"; agents: {', '.join(plain(a) for a in agents)}" if agents else \
        ("; no agent switched" if p.get("action") != "keep" else "")
    return (f"{plain(p.get('at'))}: {plain(p.get('action'))} round {num(p.get('round'))} "
            f"(from round {num(p.get('from_round'))}): {plain(p.get('reason'))}{switched}")


# ------------------------------------------------------------------------------------------- the page


def blocks(data: dict) -> list[tuple]:
    """The report as blocks of plain text, ("h1"|"h2"|"p", text), ("table", header, rows) or ("ul", items),
    rendered as Markdown and as HTML by the two functions below, each escaping for its own format."""
    rounds, promotions = data["rounds"], data["promotions"]
    shown = rounds[-ROUND_COLUMNS:]
    service = data["in_service"]
    if service["action"]:
        serving = (f"In service: round {num(service['round'])} ({plain(service['adapter'])}), since "
                   f"{plain(service['since'])} ({service['action']}).")
    else:
        serving = "In service: round 0, the config's adapter (no promote or rollback in the log)."
    out: list[tuple] = [
        ("h1", "Flywheel report"),
        ("p", f"{len(rounds)} round(s) in {plain(data['folder'])}. {serving}"),
        ("h2", "Flywheel rounds"),
        ("p", "A column per round: trained from the adapter then in service (from round) on the round's questions, "
              "evaluated against it on a held-out slice that training never saw, with the same Worker and Solver. "
              "Δ is candidate − incumbent on the same questions, with its paired bootstrap CI; a guard reads "
              "incumbent → candidate, ok or worse (beyond the margin its report.json gives); diversity is the "
              "distinct plans per held-out question. Wall seconds and tokens are what the round cost."),
    ]
    if len(rounds) > len(shown):
        out.append(("p", f"The latest {len(shown)} rounds; rounds {rounds[0]['round']} to "
                         f"{rounds[-len(shown) - 1]['round']} are in their own round_<r>/report.json."))
    if shown:
        out.append(("table", *round_table(shown)))
    else:
        out.append(("p", "No round folder yet."))
    out.append(("h2", "Promotions"))
    if promotions:
        latest = promotions[-PROMOTION_LINES:]
        out.append(("p", f"{PROMOTIONS}, oldest first (at, action, round, reason): "
                         + (f"the latest {len(latest)} of {len(promotions)} lines." if len(latest) < len(promotions)
                            else f"{len(promotions)} line(s).")))
        out.append(("ul", [promotion_line(p) for p in latest]))
    else:
        out.append(("p", f"No {PROMOTIONS} yet: no round has been gated."))
    return out


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|#~&])")


def md(text: str) -> str:
    """Plain text as Markdown that renders as that text: every character Markdown could read as markup
    (a link, emphasis, HTML, a table cell's end) backslash-escaped."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text)


def render_markdown(data: dict) -> str:
    lines: list[str] = []
    for block in blocks(data):
        kind = block[0]
        if kind in ("h1", "h2"):
            lines += [f"{'#' if kind == 'h1' else '##'} {md(block[1])}", ""]
        elif kind == "p":
            lines += [md(block[1]), ""]
        elif kind == "ul":
            lines += [f"- {md(item)}" for item in block[1]] + [""]
        else:
            header, rows = block[1], block[2]
            lines += ["| " + " | ".join(md(h) for h in header) + " |", "|" + "|".join("---" for _ in header) + "|"]
            lines += ["| " + " | ".join(md(c) for c in [label, *cells]) + " |" for label, cells in rows] + [""]
    return "\n".join(lines)


def render_html(data: dict) -> str:
    """A page that opens anywhere (inline CSS, no script): every text escaped, none read as markup."""
    e = html.escape
    body: list[str] = []
    for block in blocks(data):
        kind = block[0]
        if kind in ("h1", "h2", "p"):
            body.append(f"<{kind}>{e(block[1])}</{kind}>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{e(item)}</li>" for item in block[1]) + "</ul>")
        else:
            header, rows = block[1], block[2]
            head = "".join(f"<th>{e(h)}</th>" for h in header)
            cells = "".join(f"<tr><th>{e(label)}</th>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                            for label, row in rows)
            body.append(f'<table class="rounds"><thead><tr>{head}</tr></thead><tbody>{cells}</tbody></table>')
    return PAGE.replace("__BODY__", "\n".join(body))


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>distill: flywheel report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1rem 1.5rem; color: #222; background: #fff; max-width: 90rem; }
h1 { font-size: 1.3rem; margin: 0 0 .5rem; } h2 { margin-top: 1.5rem; }
table { border-collapse: collapse; margin: .5rem 0 1rem; }
th, td { border-bottom: 1px solid #ddd; padding: 4px 6px; text-align: left; vertical-align: top; }
thead th { background: #f3f3f3; } tbody th { font-weight: 600; white-space: nowrap; }
td { font-variant-numeric: tabular-nums; min-width: 9rem; word-break: break-word; }
</style></head>
<body>
__BODY__
</body></html>
"""


def write_flywheel_report(folder: str | Path, out_dir: str | Path | None = None) -> dict:
    """Read `folder`'s rounds and promotions log and write report.md and report.html to `out_dir` (default:
    `folder`), both or neither. Returns what was read."""
    data = load_flywheel(folder)
    out = Path(out_dir if out_dir is not None else folder)
    with replace_files(out) as tmp:
        (tmp / layout.REPORT_MD).write_text(render_markdown(data), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(data), encoding="utf-8")
    return data


def summary_lines(data: dict) -> list[str]:
    """One terminal line per round: its decision and the number it rests on, and the adapter in service."""
    lines = []
    for r in data["rounds"]:
        rep = r["report"]
        if rep is None:
            lines.append(f"round {r['round']}: unfinished (no {REPORT_JSON})")
            continue
        v = rep["verdict"]
        lines.append(f"round {r['round']} from round {num(rep.get('from_round'))}: {plain(rep['decision'])}; "
                     f"{plain(v.get('measure'))} {num(v.get('candidate'))} vs {num(v.get('incumbent'))}, "
                     f"Δ {diff_cell(v)}; {plain(rep.get('reason'), 200)}")
    service = data["in_service"]
    lines.append(f"in service: round {num(service['round'])}"
                 + (f" ({plain(service['adapter'])})" if service["adapter"] else " (the config's adapter)"))
    return lines


def main(folder: str | Path, out_dir: str | Path | None = None) -> int:
    """`distill report FLYWHEEL_DIR [--out DIR]` (distill.report sends a flywheel folder here)."""
    data = write_flywheel_report(folder, out_dir)
    out = Path(out_dir or folder)
    print("\n".join(summary_lines(data)))
    print(f"report: {out / layout.REPORT_MD}")
    print(f"page: {out / 'report.html'}")
    return 0
