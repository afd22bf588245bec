"""The Worker runs plans as a dependency graph, records every failure as evidence, and never crashes.

Concurrency is judged from the recorded step intervals (start_s, end_s), not from wall-clock thresholds,
so the tests hold on a slow or busy machine. The tools below are small real implementations of the Tool
protocol (they sleep, echo, fail), not stand-ins for anything remote.
"""

from __future__ import annotations

import asyncio

import pytest

from distill.core.errors import DistillError
from distill.rewoo.plan import Plan, Step, parse_plan
from distill.rewoo.worker import NO_EVIDENCE, Evidence, WorkerConfig, run_plan, run_plan_sync, truncate
from distill.tools.calculator import Calculator


class Echo:
    """Returns `<query>` after an optional delay given per query, so tests see exactly what a step received."""

    def __init__(self, name: str = "Echo", delays: dict[str, float] | None = None, default_delay: float = 0.0):
        self.name = name
        self.description = "echoes its input"
        self.delays = delays or {}
        self.default_delay = default_delay
        self.queries: list[str] = []

    async def run(self, query: str) -> str:
        self.queries.append(query)
        await asyncio.sleep(self.delays.get(query, self.default_delay))
        return f"<{query}>"


class Fixed:
    """Returns a fixed value (or raises it, if it is an exception) after a delay."""

    def __init__(self, name: str, value: object, delay: float = 0.0):
        self.name, self.description, self.value, self.delay = name, "fixed", value, delay

    async def run(self, query: str) -> str:
        await asyncio.sleep(self.delay)
        if isinstance(self.value, BaseException):
            raise self.value
        return self.value  # type: ignore[return-value]


class Never:
    """Never answers: only a timeout ends its step, however slow the machine."""

    def __init__(self, name: str):
        self.name, self.description = name, "never answers"

    async def run(self, query: str) -> str:
        await asyncio.Event().wait()
        return "late"


def plan_of(*lines: str) -> Plan:
    text = "\n".join(f"Plan: step {i}.\n{line}" for i, line in enumerate(lines, 1))
    return parse_plan(text)


def step(step_id: str, tool: str, text: str, deps: tuple[str, ...] = ()) -> Step:
    return Step(step_id, f"do {step_id}", tool, text, deps)


def by_id(evidence: list[Evidence]) -> dict[str, Evidence]:
    return {e.id: e for e in evidence}


def max_overlap(evidence: list[Evidence]) -> int:
    """The largest number of tool calls in flight at one instant (an end at t comes before a start at t)."""
    events = sorted([(e.start_s, 1) for e in evidence] + [(e.end_s, -1) for e in evidence], key=lambda x: (x[0], x[1]))
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best


def test_independent_steps_overlap() -> None:
    plan = plan_of(*(f"#E{i} = Echo[q{i}]" for i in range(1, 5)))
    evidence = run_plan_sync(plan, {"Echo": Echo(default_delay=0.2)})
    assert [e.status for e in evidence] == ["ok"] * 4
    # All four were running at the same instant: the latest start precedes the earliest end.
    assert max(e.start_s for e in evidence) < min(e.end_s for e in evidence)
    assert max_overlap(evidence) == 4


def test_dependent_step_starts_after_its_dependency_ends() -> None:
    plan = plan_of("#E1 = Echo[a]", "#E2 = Echo[b]", "#E3 = Echo[#E1 then #E2]")
    ev = by_id(run_plan_sync(plan, {"Echo": Echo(delays={"a": 0.1, "b": 0.2})}))
    assert ev["#E3"].start_s >= ev["#E1"].end_s
    assert ev["#E3"].start_s >= ev["#E2"].end_s
    assert ev["#E3"].input == "<a> then <b>"
    assert ev["#E3"].output == "<<a> then <b>>"


def test_a_step_starts_when_its_own_deps_finish_not_its_level() -> None:
    # E3 depends only on the fast E2, so it must start while the slow E1 (same level as E2) is still running.
    plan = plan_of("#E1 = Echo[slow]", "#E2 = Echo[fast]", "#E3 = Echo[after #E2]", "#E4 = Echo[after #E1]")
    ev = by_id(run_plan_sync(plan, {"Echo": Echo(delays={"slow": 0.5, "fast": 0.05})}))
    assert ev["#E3"].start_s >= ev["#E2"].end_s
    assert ev["#E3"].end_s < ev["#E1"].end_s
    assert ev["#E4"].start_s >= ev["#E1"].end_s


def test_semaphore_caps_concurrent_tool_calls() -> None:
    plan = plan_of(*(f"#E{i} = Echo[q{i}]" for i in range(1, 11)))
    evidence = run_plan_sync(plan, {"Echo": Echo(default_delay=0.05)}, WorkerConfig(max_concurrency=3))
    assert len(evidence) == 10 and all(e.status == "ok" for e in evidence)
    assert max_overlap(evidence) == 3


def test_max_concurrency_one_runs_steps_one_after_another() -> None:
    plan = plan_of(*(f"#E{i} = Echo[q{i}]" for i in range(1, 5)))
    evidence = run_plan_sync(plan, {"Echo": Echo(default_delay=0.01)}, WorkerConfig(max_concurrency=1))
    assert max_overlap(evidence) == 1


def test_substitution_is_exact_with_ten_and_more_steps() -> None:
    lines = [f"#E{i} = Echo[v{i}]" for i in range(1, 12)]
    lines.append("#E12 = Echo[#E1|#E10|#E11|#E1]")
    evidence = run_plan_sync(plan_of(*lines), {"Echo": Echo()})
    assert [e.id for e in evidence] == [f"#E{i}" for i in range(1, 13)]  # step order
    assert evidence[-1].input == "<v1>|<v10>|<v11>|<v1>"
    assert evidence[-1].output == "<<v1>|<v10>|<v11>|<v1>>"


def test_a_long_chain_passes_evidence_along() -> None:
    lines = ["#E1 = Calculator[1 + 1]"] + [f"#E{i} = Calculator[#E{i - 1} + 1]" for i in range(2, 13)]
    evidence = run_plan_sync(plan_of(*lines), {"Calculator": Calculator()})
    assert [e.output for e in evidence] == [str(n) for n in range(2, 14)]
    assert all(later.start_s >= earlier.end_s for earlier, later in zip(evidence, evidence[1:]))


def test_a_raising_tool_is_recorded_and_its_dependents_still_run() -> None:
    plan = plan_of("#E1 = Boom[x]", "#E2 = Echo[got #E1]")
    tools = {"Boom": Fixed("Boom", RuntimeError("backend exploded")), "Echo": Echo()}
    ev = by_id(run_plan_sync(plan, tools))
    assert ev["#E1"].status == "error"
    assert ev["#E1"].output == NO_EVIDENCE
    assert ev["#E1"].error == "RuntimeError: backend exploded"
    assert ev["#E2"].status == "ok"
    assert ev["#E2"].input == f"got {NO_EVIDENCE}"


def test_a_slow_tool_times_out_under_its_own_limit() -> None:
    plan = plan_of("#E1 = Slow[x]", "#E2 = Echo[y]", "#E3 = Echo[#E1]")
    tools = {"Slow": Never("Slow"), "Echo": Echo(default_delay=0.1)}
    config = WorkerConfig(tool_timeout_s={"Slow": 0.05})  # Echo keeps the 30 s default
    ev = by_id(run_plan_sync(plan, tools, config))
    assert ev["#E1"].status == "timeout"
    assert ev["#E1"].output == NO_EVIDENCE
    assert "0.05" in (ev["#E1"].error or "")
    assert ev["#E2"].status == "ok"
    assert ev["#E3"].input == NO_EVIDENCE and ev["#E3"].status == "ok"


def test_a_global_timeout_applies_to_every_tool() -> None:
    evidence = run_plan_sync(plan_of("#E1 = Echo[x]"), {"Echo": Never("Echo")}, WorkerConfig(tool_timeout_s=0.05))
    assert evidence[0].status == "timeout"


@pytest.mark.parametrize("value", ["", "   \n\t", None])
def test_empty_output_is_recorded_as_empty(value: object) -> None:
    evidence = run_plan_sync(plan_of("#E1 = Quiet[x]"), {"Quiet": Fixed("Quiet", value)})
    assert evidence[0].status == "empty"
    assert evidence[0].output == NO_EVIDENCE
    assert evidence[0].error


def test_an_unknown_tool_is_recorded_and_the_rest_runs() -> None:
    plan = plan_of("#E1 = Search[x]", "#E2 = Echo[#E1]")
    ev = by_id(run_plan_sync(plan, {"Echo": Echo()}))
    assert ev["#E1"].status == "error"
    assert ev["#E1"].error == "unknown tool 'Search'"
    assert ev["#E1"].output == NO_EVIDENCE
    assert ev["#E2"].output == f"<{NO_EVIDENCE}>"


def test_evidence_is_truncated_when_stored_and_when_passed_on() -> None:
    plan = plan_of("#E1 = Long[x]", "#E2 = Echo[#E1]")
    tools = {"Long": Fixed("Long", "x" * 5000), "Echo": Echo()}
    ev = by_id(run_plan_sync(plan, tools, WorkerConfig(evidence_max_chars=100)))
    assert len(ev["#E1"].output) == 100
    assert ev["#E1"].output == "x" * 99 + "…"
    assert ev["#E2"].input == ev["#E1"].output
    assert len(ev["#E2"].output) == 100 and ev["#E2"].output.endswith("…")


def test_truncate_leaves_short_text_alone() -> None:
    assert truncate("abc", 3) == "abc"
    assert truncate("abcd", 3) == "ab…"


def test_undefined_and_forward_refs_are_left_as_written() -> None:
    plan = plan_of("#E1 = Echo[see #E2 and #E7]", "#E2 = Echo[b]")
    assert not plan.valid  # the parser flags them; the Worker still runs every step
    ev = by_id(run_plan_sync(plan, {"Echo": Echo()}))
    assert ev["#E1"].input == "see #E2 and #E7"
    assert ev["#E1"].status == "ok" and ev["#E2"].status == "ok"


def test_self_reference_does_not_deadlock() -> None:
    plan = Plan((step("#E1", "Echo", "#E1 again", ("#E1",)),), ())
    evidence = asyncio.run(asyncio.wait_for(run_plan(plan, {"Echo": Echo()}), 5))
    assert evidence[0].input == "#E1 again"


def test_a_duplicate_id_refers_to_the_latest_earlier_definition() -> None:
    plan = plan_of("#E1 = Echo[a]", "#E1 = Echo[b]", "#E2 = Echo[#E1]")
    evidence = run_plan_sync(plan, {"Echo": Echo()})
    assert [e.input for e in evidence] == ["a", "b", "<b>"]


def test_an_empty_plan_yields_no_evidence() -> None:
    assert run_plan_sync(parse_plan("I do not know."), {"Echo": Echo()}) == []


def test_evidence_to_dict_has_the_record_fields() -> None:
    evidence = run_plan_sync(plan_of("#E1 = Calculator[6*7]"), {"Calculator": Calculator()})
    record = evidence[0].to_dict()
    assert set(record) == {"id", "tool", "input", "output", "status", "error", "start_s", "end_s", "injected"}
    assert record["output"] == "42" and record["status"] == "ok" and record["error"] is None
    assert record["injected"] is False
    assert 0 <= record["start_s"] <= record["end_s"]


def test_run_plan_works_inside_a_running_loop() -> None:
    async def main() -> list[Evidence]:
        return await run_plan(plan_of("#E1 = Echo[x]", "#E2 = Echo[#E1]"), {"Echo": Echo()})

    assert [e.output for e in asyncio.run(main())] == ["<x>", "<<x>>"]


def test_a_bad_concurrency_setting_is_a_clear_error() -> None:
    with pytest.raises(DistillError, match="max_concurrency"):
        run_plan_sync(plan_of("#E1 = Echo[x]"), {"Echo": Echo()}, WorkerConfig(max_concurrency=0))
