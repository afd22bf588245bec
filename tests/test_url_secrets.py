"""No secret in a URL leaks: a URL that carries credentials (`https://user:password@host/v1`, `?api_key=...`) is
refused when the config is read, in one line that names the setting and not the password, and exit 2, whatever
setting of whichever command holds it; nothing is written, logged or printed with the password in it.

The settings are enumerated from the config classes themselves (every setting that can hold a string, nested
endpoints and dataset entries included, the pipeline's sections through their stages' classes, training's
through TRL's argument classes), so a URL setting added later is planted and checked without this file knowing
its name. Each is given a URL with a password of its own, the command is run through the real `distill` entry
(plain, `--check`, `-v`), and stdout, stderr, the log and every file under the working folder are searched.
Nothing here needs a network: a refused config calls nothing (a process or a server started is a failure).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import signal
import subprocess
import time
import typing
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from distill.core import secrets
from distill.cli import main
from distill.core.config import AgentConfig, check_base_url
from distill.core.errors import DistillError

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
REFUSAL = "a URL must not carry credentials"
# names of settings whose value is (or may be) an address: each also runs with --check and -v
URL_SHAPED = re.compile(r"url|uri|endpoint|host|contact|source|data_files|server|hub", re.IGNORECASE)
# what was searched, printed at the end of the module (the closing note quotes it)
SEARCHED: dict[str, set[str]] = {"settings": set(), "url-shaped settings": set(), "files": set(),
                                 "streams": {"stdout", "stderr", "log records"}, "runs": set()}


def _string_typed(annotation) -> bool:
    """Whether a setting of this type can hold a string (str, list[str], dict[str, ...], Any, ...)."""
    if annotation is str or annotation is typing.Any:
        return True
    if typing.get_origin(annotation) is typing.Literal:
        return False
    return any(_string_typed(a) for a in typing.get_args(annotation))


def _models_in(annotation) -> list[tuple[str, type[BaseModel]]]:
    """Nested config models under a setting: (path step, model): `x` for a model, `x.0` for a list of them."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [("", annotation)]
    if origin is list and args and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return [(".0", args[0])]
    return [found for a in args for found in _models_in(a)]


def settings_of(cls, prefix: str = "") -> list[str]:
    """Every setting of a config class (dotted, as `--set` takes it) that can hold a string."""
    if dataclasses.is_dataclass(cls) and not issubclass(cls, BaseModel):  # TRL's argument classes
        hints = typing.get_type_hints(cls)
        return [f"{prefix}{f.name}" for f in dataclasses.fields(cls) if f.init and _string_typed(hints[f.name])]
    out = []
    for name, field in cls.model_fields.items():
        nested = _models_in(field.annotation)
        for step, model in nested:
            out += settings_of(model, f"{prefix}{name}{step}.")
        if not nested and _string_typed(field.annotation):
            out.append(f"{prefix}{name}")
    return out


def train_settings(prefix: str = "") -> list[str]:
    from distill.train import _sft_classes

    return [s for cls in _sft_classes() for s in settings_of(cls, prefix)]


def pipeline_settings() -> list[str]:
    """The pipeline's own settings, and each section's through the class of the stage it configures."""
    from distill.evaluate import EvalConfig
    from distill.filter import FilterConfig
    from distill.generate import GenerateConfig
    from distill.improve import ImproveConfig
    from distill.pipeline import PipelineConfig
    from distill.report import ReportConfig
    from distill.serving.serve import ServeConfig
    from distill.sft_data import SftDataConfig

    sections = {"generate": GenerateConfig, "teacher_server": ServeConfig, "filter": FilterConfig,
                "sft_data": SftDataConfig, "improve": ImproveConfig, "student_server": ServeConfig,
                "eval": EvalConfig, "report": ReportConfig}
    own = [s for s in settings_of(PipelineConfig) if s.split(".")[0] not in {*sections, "train", "students"}]
    missing = set(PipelineConfig.model_fields) - {*sections, "train", "students", *(s.split(".")[0] for s in own)}
    assert not {m for m in missing if _string_typed(PipelineConfig.model_fields[m].annotation)}, missing
    return own + [s for name, cls in sections.items() for s in settings_of(cls, f"{name}.")] + train_settings("train.")


def _commands():
    """(command, argv before the flags, its config class's settings, has --check)."""
    from distill.serving.agent_server import AgentServerConfig
    from distill.evaluate import EvalConfig
    from distill.filter import FilterConfig
    from distill.generate import GenerateConfig
    from distill.improve import ImproveConfig
    from distill.serving.serve import ServeConfig
    from distill.sft_data import SftDataConfig

    fixture = str(ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl")
    return [
        ("ask", ["ask", "Who?", "--config", str(CONFIGS / "ask_smollm2_local.yaml")], settings_of(AgentConfig), False),
        ("generate", ["generate", "--config", str(CONFIGS / "generate_teacher.yaml")], settings_of(GenerateConfig), True),
        ("eval", ["eval", "--config", str(CONFIGS / "eval_smollm2_cpu.yaml")], settings_of(EvalConfig), True),
        ("improve", ["improve", "--config", str(CONFIGS / "improve_smollm2_cpu.yaml")], settings_of(ImproveConfig),
         True),
        ("filter", ["filter", fixture, "--out", "kept.jsonl", "--config", str(CONFIGS / "filter.yaml")],
         settings_of(FilterConfig), False),
        ("sft-data", ["sft-data", fixture, "--out", "sft"], settings_of(SftDataConfig), False),
        ("train", ["train", "--config", str(CONFIGS / "smollm2-135m_lora_cpu.yaml")], train_settings(), True),
        ("serve", ["serve", "--config", str(CONFIGS / "serve_planner.yaml")], settings_of(ServeConfig), False),
        ("serve-agent", ["serve-agent", "--config", str(CONFIGS / "agent_server.yaml")],
         settings_of(AgentServerConfig), False),
        ("pipeline", ["pipeline", "--config", str(CONFIGS / "demo_smollm2_cpu.yaml")], pipeline_settings(), True),
    ]


class Started(AssertionError):
    """A refused config started something: a process, a server, or a run that outlasted the alarm."""


@pytest.fixture
def world(tmp_path, monkeypatch, capsys, caplog):
    """A working folder of its own (every relative output path lands in it), nothing that may start a process
    or a server, and `run(argv)` -> (exit code, stdout, stderr, log)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("DISTILL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))

    def forbidden(*args, **kwargs):
        raise Started(f"started {args[:1]}")

    monkeypatch.setattr(subprocess, "Popen", forbidden)
    import uvicorn

    monkeypatch.setattr(uvicorn.Server, "run", forbidden)

    def alarm(signum, frame):
        raise Started("still running after 60 s")

    previous = signal.signal(signal.SIGALRM, alarm)
    caplog.set_level(logging.DEBUG)

    def run(argv: list[str]) -> tuple[int, str, str, str]:
        caplog.clear()
        signal.alarm(60)
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse
            rc = exc.code
        finally:
            signal.alarm(0)
        out, err = capsys.readouterr()
        return rc, out, err, caplog.text

    yield run
    signal.signal(signal.SIGALRM, previous)


def _holding(folder: Path, secret: str) -> list[str]:
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            SEARCHED["files"].add(path.name)
            if secret.encode() in path.read_bytes():
                found.append(str(path))
    return found


def _refused(run, argv: list[str], password: str, setting: str, work: Path) -> list[str]:
    """What went wrong (nothing: refused in one line naming the setting, the password nowhere)."""
    start = time.time_ns()
    rc, out, err, log = run(argv)
    problems = []
    if rc != 2:
        problems.append(f"exit {rc}")
    lines = err.strip().splitlines()
    if "-v" in argv:  # -v adds the traceback above the line
        lines = lines[-1:]
    if len(lines) != 1 or REFUSAL not in lines[0]:
        problems.append(f"stderr is not the one refusal line: {err.strip()[-300:]!r}")
    elif setting.split(".")[-1] not in lines[0]:
        problems.append(f"the line does not name {setting}: {lines[0]!r}")
    for stream, text in (("stdout", out), ("stderr", err), ("log", log)):
        if password in text:
            problems.append(f"the password is in {stream}")
    if files := _holding(work, password):
        problems.append(f"the password is in {files}")
    if written := [str(p.relative_to(work)) for p in work.rglob("*") if p.is_file() and p.stat().st_mtime_ns >= start]:
        problems.append(f"a refused run wrote {written[:5]}")  # nothing to leak because nothing is written
    return problems


def _plant(setting: str, password: str) -> str:
    """The setting's URL: a password of its own as userinfo; a secret query parameter for every third, so
    both kinds are refused everywhere."""
    if sum(map(ord, setting)) % 3 == 0:
        return f"https://api.example.org/v1?model=m&api_key={password}"
    return f"https://user:{password}@api.example.org/v1"


@pytest.mark.parametrize("command", [c[0] for c in _commands()])
def test_a_url_with_credentials_in_any_setting_is_refused_and_its_password_shown_nowhere(command, world, tmp_path):
    _, argv, settings, has_check = next(c for c in _commands() if c[0] == command)
    assert settings, f"{command}: no string setting found: the enumeration is broken"
    work = tmp_path / "work"
    failures = []
    for setting in settings:
        SEARCHED["settings"].add(f"{command}: {setting}")
        modes = [[]]
        if URL_SHAPED.search(setting.split(".")[-1]):
            SEARCHED["url-shaped settings"].add(f"{command}: {setting}")
            modes += [["--check", "--offline"], ["--check"]] if has_check else []
            modes += [["-v"]]
        for mode in modes:
            password = f"pw-{uuid.uuid4().hex}"
            flags = ["--set", f"{setting}={_plant(setting, password)}"]
            full = ["-v", *argv, *flags] if mode == ["-v"] else [*argv, *mode, *flags]
            if command == "serve" and not mode:
                full.append("--dry-run")  # and plain below: both refuse before vLLM
            SEARCHED["runs"].add(f"{command} {' '.join(mode) or 'plain'} {setting}")
            problems = _refused(world, full, password, setting, work)
            if command == "serve" and not mode:
                problems += _refused(world, full[:-1], password, setting, work)
            if problems:
                failures.append(f"{' '.join(mode) or 'plain'} {setting}: {'; '.join(problems)}")
    assert not failures, f"{command}: {len(failures)} of {len(settings)} settings leak or are not refused:\n" + \
        "\n".join(failures[:20])


def test_a_stage_config_named_by_a_pipeline_section_is_refused_too(world, tmp_path):
    """`generate: {config: FILE}`: the file's URL is read when the section is, not from the pipeline's own text."""
    password = f"pw-{uuid.uuid4().hex}"
    stage = yaml.safe_load((CONFIGS / "generate_teacher.yaml").read_text())
    stage["wikipedia_contact"] = f"https://u:{password}@h.example.org/me"  # (endpoints give way to the teacher)
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(stage))
    for mode in ([], ["--check", "--offline"]):
        argv = ["pipeline", "--config", str(CONFIGS / "demo_smollm2_cpu.yaml"), *mode,
                "--set", f"generate.config={tmp_path / 'gen.yaml'}"]
        problems = _refused(world, argv, password, "wikipedia_contact", tmp_path / "work")
        assert not problems, problems


@pytest.mark.parametrize("variable,argv", [
    ("OPENAI_BASE_URL", ["generate", "--check", "--config", str(CONFIGS / "generate_teacher.yaml"),
                         "--set", "planner.base_url=null", "--set", "planner.api_key_env=DISTILL_TEST_KEY"]),
    ("HF_ENDPOINT", ["generate", "--config", str(CONFIGS / "generate_teacher.yaml"),
                     "--set", "datasets.0.source=hub:hotpot_qa:distractor"]),
])
def test_an_address_from_the_environment_is_refused_the_same_way(variable, argv, world, monkeypatch, tmp_path):
    password = f"pw-{uuid.uuid4().hex}"
    monkeypatch.setenv(variable, f"https://user:{password}@127.0.0.1:9/v1")
    monkeypatch.setenv("DISTILL_TEST_KEY", "sk-test-0123456789")
    SEARCHED["settings"].add(f"environment: {variable}")
    SEARCHED["url-shaped settings"].add(f"environment: {variable}")
    problems = _refused(world, argv, password, variable, tmp_path / "work")
    assert not problems, problems


def test_the_hub_endpoint_of_push_is_refused(world, monkeypatch, tmp_path):
    password = f"pw-{uuid.uuid4().hex}"
    adapter = tmp_path / "work" / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "m", "r": 8}))
    (adapter / "adapter_model.safetensors").write_bytes(b"\0")
    monkeypatch.setenv("HF_ENDPOINT", f"https://user:{password}@127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_test_0123456789")
    SEARCHED["settings"].add("push: environment HF_ENDPOINT")
    SEARCHED["url-shaped settings"].add("push: environment HF_ENDPOINT")
    for extra in ([], ["--dry-run"]):
        problems = _refused(world, ["push", str(adapter), "--repo-id", "me/planner", *extra], password,
                            "HF_ENDPOINT", tmp_path / "work")
        assert not problems, problems


def test_clients_built_in_code_refuse_such_a_url_too():
    """The HTTP clients themselves: a backend or tool built without a checked config never sends a URL's
    user:password as Basic auth."""
    from distill.llm.openai_backend import OpenAIChat
    from distill.tools.wikipedia import OnlineWikipedia

    for build in (lambda url: OpenAIChat("m", [url]), lambda url: OnlineWikipedia(api_url=url),
                  lambda url: OnlineWikipedia(contact=url)):
        with pytest.raises(DistillError, match=REFUSAL) as refused:
            build("https://user:PW-in-code-1234@127.0.0.1:9/v1")
        assert "PW-in-code-1234" not in str(refused.value)
    with pytest.raises(ValueError, match=REFUSAL) as refused:
        check_base_url("user:PW-no-scheme-1234@127.0.0.1:9/v1")  # not even a scheme: still no echo
    assert "PW-no-scheme-1234" not in str(refused.value)


def test_good_addresses_and_email_contacts_pass():
    cfg = AgentConfig.model_validate({"wikipedia_contact": "me@example.org", "planner": {
        "backend": "openai", "base_url": "http://127.0.0.1:8000/v1?model_key_env=X&api-version=2024"}})
    assert cfg.wikipedia_contact == "me@example.org"
    for text in ("http://127.0.0.1:8000/v1", "mailto:me@example.org", "https://h/v1?keyword=a&monkeys=2"):
        assert secrets.url_credentials(text) is None and secrets.mask(text) == text


@pytest.mark.parametrize("text,masked", [
    ("connect to https://u:SECRET-1@host/x failed", "connect to https://u:***@host/x failed"),
    ("'https://ghp_TokenAsUser@github.com/o/r.git'", "'https://***@github.com/o/r.git'"),
    ('{"url":"http://u:p4ss@h:8/v1","mail":"a@b.org"}', '{"url":"http://u:***@h:8/v1","mail":"a@b.org"}'),
    ("https://u:p@ss@host/v1", "https://u:***@host/v1"),
    ("GET http://h/v1?api_key=K1&model=m&token=T2&sig=S3#f", "GET http://h/v1?api_key=***&model=m&token=***&sig=***#f"),
    ("no url here, mail me@example.org", "no url here, mail me@example.org"),
])
def test_the_masker_scrubs_url_credentials_from_any_text(text, masked):
    assert secrets.mask(text) == masked


def test_zz_print_what_was_searched():
    """The list the closing note quotes (run with -s to see it)."""
    for what, names in SEARCHED.items():
        print(f"{what} ({len(names)}):")
        for name in sorted(names) if what != "runs" else ():
            print(f"  {name}")
    commands = sorted({s.split(":")[0] for s in SEARCHED["settings"]})
    print("settings per command: " + ", ".join(
        f"{c} {sum(s.startswith(c + ':') for s in SEARCHED['settings'])}" for c in commands))
