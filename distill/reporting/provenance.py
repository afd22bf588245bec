"""Where the report's numbers come from: the models, the adapter, the data and the code, read from the run folder.

A number without its origin cannot be shared: "the student" means nothing without its base model, its LoRA rank,
how many examples it saw and how far its loss fell. Everything here is read from files the stages already write
(eval's manifest.json; in a pipeline's run folder, generate/manifest.json, sft-data/<student>/summary.json,
train/<student>/distill_adapter.json and each stage's DONE.json, where distill.core.layout puts them), and from the
adapter folders the evaluated rows were served from (eval's fingerprints name them; training records in each its
prompt, tools, teacher and data), so a run made stage by stage, or rebuilt elsewhere, says the same.
A file that is absent or unreadable leaves its items None (shown "unknown"), never a traceback: the tables
below the provenance are still worth reading without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from distill.core import layout
from distill.core.store import read_json
from distill.training.merge import ADAPTER_INFO



def served_adapters(fingerprints: Any) -> dict[str, str]:
    """{eval row: the adapter folder its planner's server serves}, from the identities a run's fingerprints
    record (vLLM's /v1/models names a LoRA module's folder as its `root`); only folders holding distill's
    record, so a base model's root or a hosted API is left out. However the run was made, this is what the row
    was actually asked of."""
    out = {}
    for row, entry in (fingerprints or {}).items():
        try:
            identity = entry["settings"]["method"]["planner"]["serves"]
        except (KeyError, TypeError):
            continue
        if folder := adapter_of(identity):
            out[row] = folder
    return out


def adapter_of(identity: Any) -> str | None:
    """The adapter folder (holding distill's record) a model identity (`OpenAIChat.identity`) says is served."""
    servers = identity.get("servers") if isinstance(identity, Mapping) else None
    for server in servers if isinstance(servers, list) else []:
        root = server.get("root") if isinstance(server, Mapping) else None
        if isinstance(root, str) and (Path(root) / ADAPTER_INFO).is_file():
            return root
    return None


def run_folder(eval_dir: Path) -> Path | None:
    """The pipeline's run folder an evaluation sits in (`<run>/eval`), or None for a plain `distill eval`."""
    parent = eval_dir.resolve().parent
    return parent if any(layout.stage_dir(parent, s).is_dir() for s in (layout.TRAIN, layout.SFT_DATA)) else None


def _version(code_version: str | None) -> tuple[str | None, str | None]:
    """`0.1.0+696c0d2` -> (`0.1.0`, `696c0d2`), as distill.core.run.code_version writes it."""
    if not code_version:
        return None, None
    version, _, commit = str(code_version).partition("+")
    return version, commit or None


def _model(spec: Any) -> str | None:
    return spec.get("model") if isinstance(spec, Mapping) else None


def student(folder: Path, summary: Mapping[str, Any] | None = None) -> dict:
    """What an adapter folder says about the student it holds: distill_adapter.json, which training fills with
    its prompt, tools, example counts, teacher and datasets (`summary`: the SFT data's summary.json, for an
    adapter recorded before that)."""
    adapter = read_json(folder / ADAPTER_INFO, optional=True) or {}
    summary = summary or {}
    splits = summary.get("splits") if isinstance(summary.get("splits"), dict) else {}
    tools = adapter.get("tools") or summary.get("tools")

    def first(key: str, fallback: Any) -> Any:
        return adapter.get(key) if adapter.get(key) is not None else fallback

    return {
        "base_model": adapter.get("base_model"),
        "lora_r": adapter.get("lora_r"),
        "lora_alpha": adapter.get("lora_alpha"),
        "steps": adapter.get("global_step"),
        "effective_batch_size": adapter.get("effective_batch_size"),
        "train_examples": first("train_examples", (splits.get("train") or {}).get("examples")),
        "validation_examples": first("validation_examples", (splits.get("validation") or {}).get("examples")),
        "student_prompt": first("student_prompt", summary.get("student_prompt")),
        "tools": list(tools) if isinstance(tools, (dict, list)) else None,
        "teacher": first("teacher", summary.get("teacher")),
        "datasets": first("datasets", summary.get("datasets")),
        "code_version": adapter.get("code_version"),
        "final_train_loss": adapter.get("final_train_loss"),
        "final_validation_loss": adapter.get("final_eval_loss"),
        "adapter": str(folder) if adapter else None,
        "loss_history": str(history) if (history := folder / layout.LOSS_HISTORY).is_file() else None,
    }


def students(run: Path | None) -> dict[str, dict]:
    """{student: what sft-data and train say about it}, for every student folder of the run."""
    if run is None:
        return {}
    names = sorted({p.parent.name for p in layout.stage_dir(run, layout.TRAIN).glob(f"*/{ADAPTER_INFO}")}
                   | {p.parent.name for p in layout.stage_dir(run, layout.SFT_DATA).glob(f"*/{layout.SUMMARY}")})
    return {name: student(layout.adapter(run, name),
                          read_json(layout.sft_data(run, name) / layout.SUMMARY, optional=True))
            for name in names}


def served_students(manifest: Mapping[str, Any], per_method: Mapping[str, Any]) -> tuple[dict, dict]:
    """({student: its record}, {eval row: student}) from the adapters the rows' servers served (the folders
    eval's fingerprints name): the provenance of a run made stage by stage, or of adapters moved since. A student
    is named as the row asked its server for it (the LoRA module)."""
    trained, rows = {}, {}
    for row, folder in served_adapters(manifest.get("fingerprints")).items():
        name = (per_method.get(row) or {}).get("planner_model") or Path(folder).name
        trained.setdefault(name, student(Path(folder)))
        rows[row] = name
    return trained, rows


def improvement(run: Path | None) -> dict[str, dict]:
    """{student: {folder, rounds: [round summaries]}} from `improve/<student>/round_<i>/summary.json`."""
    if run is None:
        return {}
    out = {}
    prefix = layout.ROUND.format("")
    for folder in sorted(p for p in layout.stage_dir(run, layout.IMPROVE).glob("*") if p.is_dir()):
        rounds = []
        summaries = sorted(folder.glob(f"{layout.ROUND.format('*')}/{layout.SUMMARY}"),
                           key=lambda p: int(n) if (n := p.parent.name.removeprefix(prefix)).isdigit() else 0)
        for summary in [*summaries, folder / layout.GRPO / layout.SUMMARY]:  # expert iteration's rounds, or GRPO's run
            if (found := read_json(summary, optional=True)) is not None:
                rounds.append(found | {"round": summary.parent.name.removeprefix(prefix)})
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
    generate = (read_json(layout.manifest(layout.stage_dir(run, layout.GENERATE)), optional=True)
                if run else None) or {}
    gen_config = generate.get("config") if isinstance(generate.get("config"), dict) else {}
    version, commit = _version(manifest.get("code_version"))
    trained = students(run)
    per_method = results["per_method"]
    served, served_rows = served_students(manifest, per_method)
    for name, found in served.items():  # what the run folder leaves unknown, the served adapter may say
        trained[name] = {k: v if v is not None else found.get(k) for k, v in trained.get(name, found).items()}
    rows = served_rows | student_of_rows(manifest, trained, {m: pm["planner_model"] for m, pm in per_method.items()})
    teacher = {"model": _model(gen_config.get("planner")), "prompt": gen_config.get("planner_prompt"),
               "temperature": (gen_config.get("planner") or {}).get("temperature")}
    recorded = [s["teacher"] for s in trained.values() if isinstance(s.get("teacher"), dict)]
    if teacher["model"] is None and recorded:  # no generate/ beside this evaluation: the students' own records
        teacher |= {"model": ", ".join(sorted({m for t in recorded for m in t.get("models") or []})) or None,
                    "prompt": teacher["prompt"] or "/".join(sorted({str(t.get("prompt")) for t in recorded}))}
    if version is None:
        version, commit = _version(next((s["code_version"] for s in trained.values() if s.get("code_version")), None))
    reference = results["reference"]
    fingerprints = {}
    for stage, marker in (stage_markers(run) if run else {}).items():
        if found := {k: v for k, v in marker.items() if "fingerprint" in k}:
            fingerprints[stage] = found
    return {
        "distill_version": version,
        "commit": commit,
        "config_file": manifest.get("config_file"),
        "run_dir": str(run) if run else None,
        "teacher": teacher,
        "reference": {"method": reference, "model": per_method[reference]["planner_model"],
                      "prompt": per_method[reference]["planner_prompt"]},
        "solver": {"model": _model(config.get("solver")) or _first_solver(per_method),
                   "backend": (config.get("solver") or {}).get("backend")},
        "datasets": {"eval": _datasets(config), "generate": _datasets(gen_config) or _trained_datasets(trained)},
        "students": trained,
        "student_rows": rows,
        "improve": improvement(run) or None,
        "fingerprints": fingerprints or None,
    }


def stage_markers(run: Path) -> dict[str, dict]:
    """{stage: its marker} of the run folder's stages, the report's aside (it is written after the report): each
    folder whose marker names it as its stage (a stage set aside by a rerun, `<stage>.before-<time>`, keeps a
    marker naming the stage it was), in the order the pipeline ran them, as pipeline.json lists them (the report
    stage writes it first), then any other by name. The pipeline's own list of stages is the one source of that
    order; this reads what it wrote."""
    found = {}
    for folder in sorted(run.iterdir()):
        if folder.name != layout.REPORT and layout.marker(folder).is_file():
            marker = read_json(layout.marker(folder), optional=True) or {}
            if marker.get("stage") == folder.name:
                found[folder.name] = marker
    ran = [s for s in (read_json(layout.pipeline_info(run), optional=True) or {}).get("stage_seconds") or ()
           if s in found]
    return {s: found[s] for s in ran + [s for s in found if s not in ran]}


def _first_solver(per_method: Mapping[str, Mapping[str, Any]]) -> str | None:
    return next((pm["solver_model"] for pm in per_method.values() if pm.get("solver_model")), None)


def _datasets(config: Mapping[str, Any]) -> list[dict] | None:
    found = [{k: d.get(k) for k in ("name", "split", "n", "source")} for d in config.get("datasets") or []
             if isinstance(d, dict)]
    return found or None


def _trained_datasets(trained: Mapping[str, dict]) -> list[dict] | None:
    """The datasets the students were trained on, as their records count them (train and validation examples)."""
    counts: dict[str, int] = {}
    for found in trained.values():
        for name, splits in (found.get("datasets") or {}).items():
            if isinstance(splits, dict):
                counts[name] = counts.get(name, 0) + sum(v for v in splits.values() if isinstance(v, int))
    return [{"name": name, "split": "train+validation", "n": n} for name, n in sorted(counts.items())] or None
