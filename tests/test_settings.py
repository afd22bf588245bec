"""Settings are refused at the door: every number of every config class has bounds that say what makes sense,
and the one YAML loader refuses duplicate keys, alias bombs and oversized files. A bad setting is one line
naming it (a DistillError, exit 2 from the CLI), before any work or any model call."""

from __future__ import annotations

import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distill.core.config import AgentConfig, ModelSpec, load_config, read_yaml, validate
from distill.core.data import DatasetSource
from distill.core.errors import DistillError
from distill.evaluate import EvalConfig
from distill.filter import FilterConfig
from distill.generate import GenerateConfig
from distill.serving.serve import ServeConfig
from distill.sft_data import SftDataConfig

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"
SMOKE = ROOT / "configs" / "smollm2-135m_lora_cpu.yaml"
DATASET = {"name": "hotpotqa", "source": str(MINI), "split": "train"}


@pytest.mark.parametrize("cls, setting, value", [
    (GenerateConfig, "planner.max_concurrency", 0),  # hung for ever
    (GenerateConfig, "planner.max_concurrency", -1),  # AttributeError '_sem'
    (GenerateConfig, "planner.max_retries", -1),  # AssertionError: unreachable
    (GenerateConfig, "samples_per_question", 0),  # exit 0 with nothing done
    (GenerateConfig, "datasets.0.n", 0),  # exit 0 with nothing done
    (EvalConfig, "datasets.0.n", -1),  # dropped the last question
    (GenerateConfig, "evidence_max_chars", -1),  # blanked every evidence
    (GenerateConfig, "solver.temperature", -0.5),
    (GenerateConfig, "planner.timeout_s", 0),
    (GenerateConfig, "tool_timeout_s", -1),
    (GenerateConfig, "wikipedia_max_concurrency", 0),
    (GenerateConfig, "concurrency", 0),
    (FilterConfig, "min_f1", 1.5),
    (FilterConfig, "max_steps", 0),
])
def test_each_example_of_a_senseless_setting_is_one_line_naming_it(cls, setting, value):
    data = {"datasets": [dict(DATASET)]} if cls is not FilterConfig else {}
    *parents, last = setting.split(".")
    node = data
    for key in parents:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[last] = value
    with pytest.raises(DistillError) as err:
        validate(cls, data)
    message = str(err.value)
    assert len(message.splitlines()) == 1 and setting in message, message


def test_a_zero_batch_size_is_refused_at_load_time():
    """It was a ZeroDivisionError after the model had loaded."""
    from distill.train import TrainConfig

    for over in ("per_device_train_batch_size=0", "global_batch_size=0", "learning_rate=-1e-4", "lora_r=0"):
        with pytest.raises(DistillError, match=over.split("=")[0]):
            load_config(TrainConfig, SMOKE, [over])


def test_a_number_written_as_text_is_bounded_as_the_number():
    """PyYAML reads `1e-3` (no dot) as text, which TRL's parser then takes as a number: its bounds hold too."""
    from distill.train import check_bounds

    for value, message in (("-1e-3", "learning_rate: '-1e-3' must be > 0"),
                           ("inf", "learning_rate: expected a finite number, got 'inf'")):
        with pytest.raises(DistillError, match=message):
            check_bounds({"learning_rate": value})
    check_bounds({"learning_rate": "1e-3"})  # in bounds
    check_bounds({"learning_rate": "fast"})  # no number: TRL's parser refuses it with its own message


def test_the_cli_says_a_bad_setting_in_one_line_and_exits_2_before_any_work(tmp_path):
    """`max_concurrency: 0` used to hang `distill generate` for ever."""
    cfg = {"planner": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "max_concurrency": 0},
           "datasets": [DATASET], "output_dir": str(tmp_path / "run")}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(cfg))
    done = subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(tmp_path / "gen.yaml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "planner.max_concurrency" in done.stderr and not (tmp_path / "run").exists()
    done = subprocess.run([sys.executable, "-m", "distill.train", "--config", str(SMOKE),
                           "--per-device-train-batch-size", "0"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1].startswith("error: "), done.stderr
    assert "per_device_train_batch_size: 0 must be >= 1" in done.stderr


# ---------------------------------------------------------------------------------------------- YAML


def test_anchors_that_expand_exponentially_are_refused_without_expanding(tmp_path):
    lines = ['l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 12)]  # 9^12 strings expanded
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines + ["planner: {max_tokens: 5}"]) + "\n")
    with pytest.raises(DistillError, match="anchors and aliases expand"):
        read_yaml(path)
    path.write_text("base: &base {max_tokens: 5, temperature: 0.5}\nplanner:\n  <<: *base\n  max_tokens: 7\n")
    assert read_yaml(path)["planner"] == {"max_tokens": 7, "temperature": 0.5}  # a small anchor is fine
    with pytest.raises(DistillError, match="anchors and aliases expand"):  # a --set value is read the same way
        load_config(AgentConfig, None, ["prices={a: &a [1,1,1,1,1,1,1,1,1,1], b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,"
                                        "*a], c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], d: &d [*c,*c,*c,*c,*c,*c,*c,"
                                        "*c,*c,*c], e: [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]}"])


def test_a_key_given_twice_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text("planner:\n  max_tokens: 64\n  temperature: 0.2\n  max_tokens: 512\n")
    with pytest.raises(DistillError, match=r"dup\.yaml:4: .*duplicate key 'max_tokens'"):
        read_yaml(path)


def test_a_file_too_large_for_a_config_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("seed: 1\n" + "#" * (2 << 20) + "\n")
    with pytest.raises(DistillError, match="too large for a config"):
        read_yaml(path)
    path.write_bytes(b"seed: \xff\n")
    with pytest.raises(DistillError, match="not UTF-8"):
        read_yaml(path)
    path.write_text("a: " + "[" * 20_000 + "]" * 20_000 + "\n")
    with pytest.raises(DistillError):
        read_yaml(path)


# ---------------------------------------------------------------------------------------------- property

CLASSES = [ModelSpec, AgentConfig, GenerateConfig, EvalConfig, FilterConfig, SftDataConfig, ServeConfig,
           DatasetSource]


def _is_number(annotation) -> bool:
    args = typing.get_args(annotation) or (annotation,)
    return any(a in (int, float) for a in args)


NUMERIC = sorted({(cls, name) for cls in CLASSES for name, f in cls.model_fields.items() if _is_number(f.annotation)},
                 key=lambda p: (p[0].__name__, p[1]))
BASE = {DatasetSource: {"name": "hotpotqa", "source": "x.jsonl"}, EvalConfig: {"baselines": ["direct"]}}
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-3, max_value=3), st.floats(allow_nan=True),
    st.text(max_size=20), st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers()),
)


def test_every_number_of_every_config_class_has_a_bound():
    unbounded = [f"{cls.__name__}.{name}" for cls, name in NUMERIC
                 if not any(hasattr(m, a) for m in cls.model_fields[name].metadata for a in ("ge", "gt", "le", "lt"))]
    assert len(NUMERIC) > 40 and unbounded == []


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(field=st.sampled_from(NUMERIC), value=ANY_VALUE)
def test_any_value_of_a_numeric_setting_is_a_valid_config_or_one_line_naming_it(field, value):
    cls, name = field
    try:
        cfg = validate(cls, BASE.get(cls, {}) | {name: value})
    except DistillError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1 and name in message, message
        return
    got = getattr(cfg, name)
    assert got is None or (isinstance(got, (int, float)) and got == got and abs(got) != float("inf"))
    for bound in cls.model_fields[name].metadata:
        for attr, holds in (("ge", got is None or got >= getattr(bound, "ge", got)),
                            ("gt", got is None or not hasattr(bound, "gt") or got > bound.gt)):
            assert holds, (name, value, attr)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(__import__("distill.train", fromlist=["BOUNDS"]).BOUNDS)), value=ANY_VALUE)
def test_any_value_of_a_numeric_training_setting_is_a_valid_config_or_one_line_naming_it(name, value):
    """Through TRL's own parser, as a config key: TRL's checks and ours, never a traceback."""
    from distill.train import TrainConfig

    try:
        cfg = load_config(TrainConfig, SMOKE, [f"{name}={yaml.safe_dump(value, default_flow_style=True).strip()}"])
    except DistillError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1 and name in message, message
        return
    assert cfg.sft.per_device_train_batch_size >= 1 and cfg.distill.global_batch_size >= 1


@pytest.mark.parametrize("where", ["file", "set"])
def test_an_unknown_key_says_where_it_came_from_and_the_close_known_one(tmp_path, capsys, where):
    """A misspelt key is one line: the key, whether `--set` or the file gave it, and the key it is close to."""
    from distill import cli

    path = tmp_path / "generate.yaml"
    path.write_text("conccurency: 3\n" if where == "file" else "concurrency: 3\n")
    argv = ["generate", "--config", str(path), "--check", "--offline"]
    argv += ["--set", "planner.temprature=0.5"] if where == "set" else []
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    if where == "file":
        assert err == f"error: {path}: conccurency: unknown key; did you mean concurrency?\n"
    else:
        assert err == f"error: {path}: planner.temprature (from --set): unknown key; did you mean temperature?\n"
