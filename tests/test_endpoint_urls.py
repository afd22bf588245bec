"""A model endpoint's address is checked when the config is read: a bad scheme, host or port is one line naming
the setting and exit 2, before any client library sees it (httpx raises OverflowError on port 99999)."""

from __future__ import annotations

from pathlib import Path

import pytest

from distill.cli import main
from distill.core.config import ModelSpec, validate
from distill.core.errors import DistillError

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("url,says", [
    ("http://127.0.0.1:99999/v1", "Port out of range"),
    ("ftp://x", "scheme must be http or https"),
    ("127.0.0.1:8000/v1", "scheme must be http or https"),
    ("http://", "names no host"),
    ("http://localhost:0/v1", "port 0"),
    ("http://localhost:port/v1", "not a usable URL"),
])
def test_a_bad_base_url_is_refused_naming_the_setting(url, says):
    with pytest.raises(DistillError, match=rf"c\.yaml: base_url: .*{says}"):
        validate(ModelSpec, {"backend": "openai", "base_url": url}, "c.yaml")


def test_one_bad_url_in_a_list_is_named():
    with pytest.raises(DistillError, match="base_url: .*'ftp://b'"):
        validate(ModelSpec, {"backend": "openai", "base_url": ["http://a:8000/v1", "ftp://b"]}, "c.yaml")


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/v1", "https://api.openai.com/v1", "http://[::1]:8001/v1",
                                 "http://gpu-box.internal/v1", "@server"])
def test_good_urls_and_the_server_placeholder_pass(url):
    assert validate(ModelSpec, {"backend": "openai", "base_url": url}).base_url == url


@pytest.mark.parametrize("command,config", [("generate", "generate_teacher.yaml"), ("eval", "eval_smollm2_cpu.yaml")])
def test_the_check_of_a_stage_says_it_in_one_line_and_exits_2(command, config, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc = main([command, "--check", "--offline", "--config", f"configs/{config}",
               "--set", "planner.base_url=http://127.0.0.1:99999/v1", "--set", "planner.backend=openai"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "planner.base_url" in err and "Port out of range" in err
    assert "Traceback" not in err and "OverflowError" not in err


def test_a_pipeline_section_with_a_bad_url_is_refused_by_its_check(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    rc = main(["pipeline", "--check", "--offline", "--config", "configs/demo_smollm2_cpu.yaml",
               "--set", "teacher.base_url=ftp://x", "--set", f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "teacher.base_url" in err and "scheme must be http or https" in err
