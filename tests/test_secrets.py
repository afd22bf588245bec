"""The one secret masker (`distill.core.secrets`) and the places a secret could leak: a server's error body quoted
in messages, manifests and error records; the lock file; the configs written beside an adapter.

The HTTP server here is a fake of a hosted OpenAI-compatible API (none can be reached from here) that echoes
the request's Authorization header in its error bodies, as some proxies and servers do.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from distill.core import secrets
from distill.core.errors import clip, one_line
from fakes import serving

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "tests" / "fixtures" / "hotpot_mini.jsonl"
KEY = "sk-live-Echo0123456789abcdef"


def files_holding(folder: Path, secret: str) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_the_masker_knows_env_tokens_secret_flags_and_remembered_keys(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_abcdefgh")
    monkeypatch.setenv("MY_PASSWORD", "correct-horse")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws/secret+value")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    monkeypatch.setattr(sys, "argv", ["distill", "--hub-token", "hub_from_argv", "--db-password=pw_from_argv",
                                      "--eos-token", "<|im_end|>"])
    monkeypatch.setattr(secrets, "_remembered", set())
    secrets.remember("key-from-an-oddly-named-variable")
    text = ("hf_abcdefgh correct-horse aws/secret+value hub_from_argv pw_from_argv "
            "key-from-an-oddly-named-variable false <|im_end|>")
    assert secrets.mask(text) == "*** *** *** *** *** *** false <|im_end|>"
    assert secrets.masked_argv(["--api-key", "k1234", "--hf-token=t1234", "--port", "8000", "--hf-token",
                                "--x"]) == ["--api-key", "***", "--hf-token=***", "--port", "8000", "--hf-token", "--x"]
    assert secrets.masked_mapping({"hub_token": "x", "api_key_env": "OPENAI_API_KEY", "eos_token": "<eos>",
                                   "nested": [{"password": "y"}]}) == {
        "hub_token": "***", "api_key_env": "OPENAI_API_KEY", "eos_token": "<eos>", "nested": [{"password": "***"}]}


def test_a_secret_is_masked_before_a_message_is_cut(monkeypatch):
    """Cutting first could leave most of a key in the message."""
    monkeypatch.setattr(secrets, "_remembered", set())
    secrets.remember(KEY)
    assert KEY[:12] not in clip(f"{'x' * 30} Bearer {KEY}", 50)
    assert KEY not in one_line(RuntimeError(f"invalid key {KEY}"))


def test_a_traceback_in_the_log_is_masked_as_the_message_is():
    """`log.error(..., exc_info=True)` (the agent server's unhandled errors) writes the exception's text and
    its frames after the message: the CLI's log handler masks the whole formatted record, not only the message."""
    script = f"""
import logging, sys
from distill import cli
sys.argv = ['distill']
cli.main([])  # sets up the root handler with the CLI's masking
try:
    raise RuntimeError('upstream said: invalid key ' + {KEY!r})
except RuntimeError:
    logging.getLogger('distill.serving.agent_server').error('unhandled: %s', 'see below', exc_info=True)
"""
    env = os.environ | {"OPENAI_API_KEY": KEY}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert "RuntimeError: upstream said: invalid key ***" in done.stderr, done.stderr[-2000:]
    assert KEY not in done.stdout + done.stderr


class EchoAuth(BaseHTTPRequestHandler):
    """The fake hosted API: every chat request is refused with a body that quotes the Authorization header."""

    protocol_version = "HTTP/1.1"
    status = 401

    def do_POST(self):  # noqa: N802 (http.server API)
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"error": {"message": f"invalid credentials: {self.headers.get('Authorization')}"}})
        self._reply(type(self).status, body.encode())

    def do_GET(self):  # noqa: N802
        self._reply(401, f"unauthorized ({self.headers.get('Authorization')})".encode())

    def _reply(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def echo_api():
    with serving(EchoAuth) as base:
        yield f"{base}/v1"


@pytest.mark.parametrize("status", [401, 400])  # 401 stops the run; 400 is each question's error record
def test_an_error_body_echoing_the_key_reaches_no_message_record_or_manifest(status, echo_api, tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(EchoAuth, "status", status)
    # a variable name that says nothing of a key: only the backend remembering what it read can mask it
    spec = {"backend": "openai", "model": "m", "base_url": echo_api, "api_key_env": "TEACHER_CREDENTIAL",
            "max_retries": 0, "timeout_s": 10}
    out = tmp_path / "run"
    cfg = {"planner": spec, "solver": spec, "tools": ["Calculator"], "wikipedia_corpus": None,
           "datasets": [{"name": "hotpotqa", "source": str(MINI), "split": "train", "n": 4}],
           "output_dir": str(out), "concurrency": 1, "cache": None}
    (tmp_path / "gen.yaml").write_text(yaml.safe_dump(cfg))
    env = os.environ | {"TEACHER_CREDENTIAL": KEY}
    done = subprocess.run([sys.executable, "-m", "distill.cli", "generate", "--config", str(tmp_path / "gen.yaml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "invalid credentials: Bearer ***" in done.stderr  # the server's words are kept, the key is not
    assert KEY not in done.stdout + done.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "failed" and "Bearer ***" in manifest["reason"]
    assert (out / "errors.jsonl").read_text().count("Bearer ***") >= 1
    assert files_holding(out, KEY) == []


def test_the_lock_file_names_its_holder_without_the_secrets_of_its_command_line(tmp_path):
    from distill.core.run import folder_lock

    code = ("import sys; from pathlib import Path; from distill.core.run import folder_lock\n"
            "with folder_lock(Path(sys.argv[1])):\n    print(open(Path(sys.argv[1]) / 'run.lock').read())")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path), "--hf-token", "hf_InTheArgv123",
                           "--api-key=sk-InTheArgv456"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "hf_InTheArgv123" not in done.stdout and "sk-InTheArgv456" not in done.stdout
    assert "--hf-token ***" in done.stdout and "--api-key=***" in done.stdout
    with folder_lock(tmp_path):
        pass


def test_a_train_section_is_written_without_its_hub_token():
    """stage_config.yaml is what the training child reads; the token travels in its environment instead
    (tests/test_train.py's launch test runs the real child)."""
    from distill.train import without_secrets

    written, withheld = without_secrets({"hub_token": "hf_SectionToken1", "learning_rate": 1e-4, "eos_token": "<e>"})
    assert written == {"learning_rate": 1e-4, "eos_token": "<e>"} and withheld == {"hub_token": "hf_SectionToken1"}


def test_log_lines_are_masked_with_their_arguments_filled_in(monkeypatch):
    import logging

    monkeypatch.setenv("OPENAI_API_KEY", "sk-InALogLine0123")
    record = logging.LogRecord("distill", logging.WARNING, __file__, 1, "retrying %s after %r", ("call", {
        "headers": "Bearer sk-InALogLine0123"}), None)
    assert secrets.mask_log_record(record) is True
    assert record.getMessage() == "retrying call after {'headers': 'Bearer ***'}"
