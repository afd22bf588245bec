"""Where the report's numbers come from: the models, the adapter, the data and the code, read from the run folder.

A number without its origin cannot be shared: "the student" means nothing without its base model, its LoRA rank,
how many examples it saw and how far its loss fell. Everything here is read from files the stages already write
(eval's manifest.json; in a pipeline's run folder, generate/manifest.json, sft-data/<student>/summary.json,
train/<student>/distill_adapter.json and each stage's DONE.json), so a report rebuilt elsewhere says the same.
A file that is absent or unreadable leaves its items None (shown "unknown"), never a traceback: the tables
below the provenance are still worth reading without it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from distill.merge import ADAPTER_INFO

SFT_SUMMARY = "summary.json"  # as distill.sft_data writes it
LOSS_HISTORY = "loss_history.json"  # as distill.train writes it
STAGE_MARKERS = ("generate", "filter", "sft-data", "train", "improve", "eval")


def read_json(path: Path) -> dict | None:
    """The object in `path`, or None when it is missing or not a JSON object (provenance is best effort)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def run_folder(eval_dir: Path) -> Path | None:
    """The pipeline's run folder an evaluation sits in (`<run>/eval`), or None for a plain `distill eval`."""
    parent = eval_dir.resolve().parent
    return parent if (parent / "train").is_dir() or (parent / "sft-data").is_dir() else None


def _version(code_version: str | None) -> tuple[str | None, str | None]:
    """`0.1.0+696c0d2` -> (`0.1.0`, `696c0d2`), as distill.run.code_version writes it."""
    if not code_version:
        return None, None
    version, _, commit = str(code_version).partition("+")
    return version, commit or None


def _model(spec: Any) -> str | None:
    return spec.get("model") if isinstance(spec, Mapping) else None


def students(run: Path | None) -> dict[str, dict]:
    """{student: what sft-data and train say about it}, for every student folder of the run."""
    if run is None:
        return {}
    names = sorted({p.parent.name for p in (run / "train").glob(f"*/{ADAPTER_INFO}")}
                   | {p.parent.name for p in (run / "sft-data").glob(f"*/{SFT_SUMMARY}")})
    out = {}
    for name in names:
        adapter = read_json(run / "train" / name / ADAPTER_INFO) or {}
        summary = read_json(run / "sft-data" / name / SFT_SUMMARY) or {}
        splits = summary.get("splits") if isinstance(summary.get("splits"), dict) else {}
        out[name] = {
            "base_model": adapter.get("base_model"),
            "lora_r": adapter.get("lora_r"),
            "lora_alpha": adapter.get("lora_alpha"),
            "steps": adapter.get("global_step"),
            "effective_batch_size": adapter.get("effective_batch_size"),
            "train_examples": (splits.get("train") or {}).get("examples"),
            "validation_examples": (splits.get("validation") or {}).get("examples"),
            "student_prompt": summary.get("student_prompt"),
            "tools": summary.get("tools"),
            "final_train_loss": adapter.get("final_train_loss"),
            "final_validation_loss": adapter.get("final_eval_loss"),
            "adapter": str(run / "train" / name) if adapter else None,
            "loss_history": str(history) if (history := run / "train" / name / LOSS_HISTORY).is_file() else None,
        }
    return out


def improvement(run: Path | None) -> dict[str, dict]:
    """{student: {folder, rounds: [round summaries]}} from `improve/<student>/round_<i>/summary.json`."""
    if run is None:
        return {}
    out = {}
    for folder in sorted(p for p in (run / "improve").glob("*") if p.is_dir()):
        rounds = []
        summaries = sorted(folder.glob("round_*/summary.json"),
                           key=lambda p: int(p.parent.name[6:]) if p.parent.name[6:].isdigit() else 0)
        for summary in [*summaries, folder / "grpo" / "summary.json"]:  # expert iteration's rounds, or GRPO's run
            if (found := read_json(summary)) is not None:
                rounds.append(found | {"round": summary.parent.name.removeprefix("round_")})
        if rounds:
            out[folder.name] = {"folder": str(folder), "rounds": rounds}
    return out


def student_of_rows(manifest: Mapping[str, Any], trained: Mapping[str, dict],
                    planner_models: Mapping[str, str | None]) -> dict[str, str]:
    """{eval row: the student it serves}: a row whose planner model (the LoRA module asked for) or name is a
    trained student. `planner_models`: row -> the planner model its records name."""
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    models = {p.get("name"): _model(p.get("spec")) for p in config.get("planners") or [] if isinstance(p, dict)}
    out = {}
    for row in planner_models:
        for candidate in (models.get(row), planner_models[row], row):
            if candidate in trained:
                out[row] = candidate
                break
    return out


def collect(eval_dir: str | Path, manifest: Mapping[str, Any], results: Mapping[str, Any]) -> dict:
    """The provenance dict of results.json (see the module's docstring); `results` gives the rows' models."""
    eval_dir = Path(eval_dir)
    run = run_folder(eval_dir)
    config = manifest.get("config") if isinstance(manifest.get("config"), dict) else {}
    generate = (read_json(run / "generate" / "manifest.json") if run else None) or {}
    gen_config = generate.get("config") if isinstance(generate.get("config"), dict) else {}
    version, commit = _version(manifest.get("code_version"))
    trained = students(run)
    per_method = results["per_method"]
    rows = student_of_rows(manifest, trained, {m: pm["planner_model"] for m, pm in per_method.items()})
    reference = results["reference"]
    fingerprints = {}
    for stage in STAGE_MARKERS:
        marker = (read_json(run / stage / "DONE.json") if run else None) or {}
        if found := {k: v for k, v in marker.items() if "fingerprint" in k}:
            fingerprints[stage] = found
    return {
        "distill_version": version,
        "commit": commit,
        "config_file": manifest.get("config_file"),
        "run_dir": str(run) if run else None,
        "teacher": {"model": _model(gen_config.get("planner")), "prompt": gen_config.get("planner_prompt"),
                    "temperature": (gen_config.get("planner") or {}).get("temperature")},
        "reference": {"method": reference, "model": per_method[reference]["planner_model"],
                      "prompt": per_method[reference]["planner_prompt"]},
        "solver": {"model": _model(config.get("solver")) or _first_solver(per_method),
                   "backend": (config.get("solver") or {}).get("backend")},
        "datasets": {"eval": _datasets(config), "generate": _datasets(gen_config)},
        "students": trained,
        "student_rows": rows,
        "improve": improvement(run) or None,
        "fingerprints": fingerprints or None,
    }


def _first_solver(per_method: Mapping[str, Mapping[str, Any]]) -> str | None:
    return next((pm["solver_model"] for pm in per_method.values() if pm.get("solver_model")), None)


def _datasets(config: Mapping[str, Any]) -> list[dict] | None:
    found = [{k: d.get(k) for k in ("name", "split", "n", "source")} for d in config.get("datasets") or []
             if isinstance(d, dict)]
    return found or None
