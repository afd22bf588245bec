"""`distill push`: the model card from the adapter's own records, the allow-listed upload, the token kept out of
every message. The Hub cannot be reached from here, so the upload goes to a local fake of the three Hub
endpoints huggingface_hub's `create_repo` + `upload_folder` call (repo create, preupload, commit); the client
code is the real huggingface_hub."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import save_file

from distill.core.errors import DistillError
from distill.training.push import UPLOAD, model_card, push
from fakes import serving

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_test_secret_token_123456"


class FakeHub:
    """Records every request; `status` set to an int makes every call fail with it, echoing the Authorization
    header in the body as some servers do. `handler` answers for it; `url` is where it is served."""

    def __init__(self):
        self.requests: list[tuple[str, str, str | None]] = []
        self.files: dict[str, bytes] = {}
        self.status: int | None = None
        self.metadata: dict | None = None
        self.hold: threading.Event | None = None  # set: every POST waits for it (a Hub that never answers)
        self.url = ""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # a held request whose client gave up: its test
                    pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization")
                hub.requests.append(("POST", self.path, auth))
                if hub.hold is not None:
                    hub.hold.wait()
                if hub.status is not None:
                    return self._reply(hub.status, {"error": f"bad credentials: {auth}"})
                if auth != f"Bearer {TOKEN}":
                    return self._reply(401, {"error": "no token"})
                if self.path == "/api/repos/create":
                    name = json.loads(body)
                    repo = f"{name.get('organization') or 'me'}/{name['name']}"
                    return self._reply(200, {"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
                if self.path == "/api/validate-yaml":  # the card's metadata must be YAML the Hub reads
                    content = json.loads(body)["content"]
                    try:
                        hub.metadata = yaml.safe_load(content.split("---\n")[1])
                    except (IndexError, yaml.YAMLError) as exc:
                        return self._reply(400, {"error": f"invalid metadata: {exc}"})
                    return self._reply(200, {"errors": [], "warnings": []})
                if "/preupload/" in self.path:
                    files = json.loads(body)["files"]
                    return self._reply(200, {"files": [{"path": f["path"], "uploadMode": "regular",
                                                        "shouldIgnore": False} for f in files]})
                if "/commit/" in self.path:
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "file":
                            hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    repo = self.path.split("/api/models/")[1].split("/commit/")[0]
                    return self._reply(200, {"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{'1' * 40}",
                                             "commitOid": "1" * 40})
                return self._reply(404, {"error": f"the fake hub has no {self.path}"})

            def do_GET(self):
                hub.requests.append(("GET", self.path, self.headers.get("Authorization")))
                return self._reply(404, {"error": f"the fake hub has no {self.path}"})

        self.handler = Handler


@pytest.fixture
def hub():
    fake = FakeHub()
    with serving(fake.handler) as fake.url:
        yield fake
        if fake.hold is not None:
            fake.hold.set()


@pytest.fixture
def adapter(tmp_path) -> Path:
    """An adapter folder as `distill train` leaves it: the serving files, distill's records, and what must stay
    home (a checkpoint, training_args.bin with its every argument)."""
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "summary.json").write_text(json.dumps({
        "student_prompt": "compact", "tools": ["Wikipedia", "LLM"],
        "splits": {"train": {"examples": 40, "questions": 20}, "validation": {"examples": 6, "questions": 3}}}))
    out = tmp_path / "adapter"
    (out / "checkpoint-3").mkdir(parents=True)
    (out / "checkpoint-3" / "optimizer.pt").write_bytes(b"state")
    (out / "training_args.bin").write_bytes(b"pickled args with hub_token")
    save_file({"base_model.model.layers.0.lora_A.weight": np.ones((8, 4), dtype=np.float32)},
              str(out / "adapter_model.safetensors"))
    (out / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "/root/models/x", "r": 8}))
    (out / "chat_template.jinja").write_text("{{ messages }}")
    (out / "distill_adapter.json").write_text(json.dumps({
        "base_model": "smollm2-135m-instruct", "lora_r": 8, "lora_alpha": 16, "lora_target_modules": "all-linear",
        "global_step": 12, "effective_batch_size": 4, "max_length": 1024, "final_train_loss": 0.8123,
        "final_eval_loss": 0.9456, "dataset_dir": str(sft)}))
    (out / "loss_history.json").write_text("{}")
    return out


def test_the_card_names_the_base_the_prompt_and_how_it_was_trained(adapter):
    card = model_card(adapter, "me/planner")
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\nlibrary_name: peft\n")
    assert "[None]" not in card and "/root/" not in card
    assert "--lora-modules planner=planner" in card and "--max-lora-rank 8" in card
    assert "tool_descriptions(['Wikipedia', 'LLM']), \"compact\")" in card
    for row in ("| optimiser steps | 12 |", "| training examples (questions) | 40 (20) |",
                "| final train / validation loss | 0.8123 / 0.9456 |", "| LoRA rank / alpha / targets | 8 / 16 / all-linear |"):
        assert row in card, row


def test_a_card_without_records_is_refused_unless_the_prompt_and_tools_are_given(tmp_path):
    (tmp_path / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "Qwen/Qwen2.5-7B-Instruct"}))
    with pytest.raises(DistillError, match="does not record student_prompt or tools .*--student-prompt KIND --tools"):
        model_card(tmp_path, "me/planner")
    card = model_card(tmp_path, "me/planner", "compact", ["Wikipedia"])
    assert "base_model: Qwen/Qwen2.5-7B-Instruct" in card and "| optimiser steps | unknown |" in card
    assert "| planner prompt, tools | `compact`, Wikipedia |" in card


def moved_adapter(adapter: Path, tmp_path: Path) -> Path:
    """The adapter as a new user has it: copied elsewhere, its SFT data left behind (the recorded dataset_dir
    is a relative path that resolves to nothing from here)."""
    import shutil

    info = json.loads((adapter / "distill_adapter.json").read_text())
    shutil.rmtree(info.pop("dataset_dir"))
    (adapter / "distill_adapter.json").write_text(json.dumps(info | {"dataset_dir": "runs/x/sft-data/student"}))
    moved = tmp_path / "elsewhere" / "student_compact"
    shutil.copytree(adapter, moved)
    shutil.rmtree(adapter)
    return moved


def test_push_on_a_moved_adapter_writes_the_prompt_and_tools_it_was_trained_on(adapter, tmp_path, monkeypatch):
    info = json.loads((adapter / "distill_adapter.json").read_text())
    (adapter / "distill_adapter.json").write_text(json.dumps(info | {
        "format_version": 2, "student_prompt": "compact",
        "tools": {"Wikipedia": "Search Wikipedia.", "LLM": "Ask a language model."},
        "train_examples": 40, "train_questions": 20, "validation_examples": 6,
        "teacher": {"models": ["Qwen/Qwen2.5-72B-Instruct"], "prompt": "fewshot"},
        "datasets": {"hotpotqa": {"train": 40, "validation": 6}}, "code_version": "0.1.0+abc1234"}))
    moved = moved_adapter(adapter, tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    done = push("student_compact", "me/c", dry_run=True)
    card = (moved / "README.md").read_text()
    assert done["uploaded"] is False
    for row in ("| planner prompt, tools | `compact`, Wikipedia, LLM |", "| training examples (questions) | 40 (20) |",
                "| teacher (its prompt) | Qwen/Qwen2.5-72B-Instruct (fewshot) |",
                "| datasets (train / validation examples) | hotpotqa (40 / 6) |", "| distill version | 0.1.0+abc1234 |"):
        assert row in card, row
    assert "Calculator" not in card and "`full`" not in card


def test_push_on_a_moved_adapter_without_records_refuses_in_one_line(adapter, tmp_path, monkeypatch):
    moved = moved_adapter(adapter, tmp_path)
    monkeypatch.chdir(tmp_path / "elsewhere")
    run = subprocess.run([sys.executable, "-m", "distill.cli", "push", "student_compact", "--repo-id", "me/c", "--dry-run"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert len(run.stderr.strip().splitlines()) == 1 and "--student-prompt KIND --tools A,B" in run.stderr
    assert not (moved / "README.md").exists()
    run = subprocess.run([sys.executable, "-m", "distill.cli", "push", "student_compact", "--repo-id", "me/c", "--dry-run",
                          "--student-prompt", "compact", "--tools", "wikipedia,llm"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr
    assert "| planner prompt, tools | `compact`, Wikipedia, LLM |" in (moved / "README.md").read_text()


def test_push_uploads_what_serving_needs_and_nothing_else(adapter, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    done = push(adapter, "me/planner", endpoint=hub.url, timeout_s=10)
    assert done["uploaded"] and set(hub.files) == {n for n in UPLOAD if (adapter / n).exists()}
    assert "training_args.bin" not in hub.files and not any(p.startswith("checkpoint") for p in hub.files)
    assert hub.files["README.md"] == (adapter / "README.md").read_bytes()
    assert hub.files["adapter_model.safetensors"] == (adapter / "adapter_model.safetensors").read_bytes()
    assert all(auth == f"Bearer {TOKEN}" for m, _, auth in hub.requests if m == "POST")
    assert hub.metadata["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and hub.metadata["library_name"] == "peft"


def test_a_refused_push_is_one_line_without_the_token(adapter, hub, tmp_path):
    """The fake answers 401 with the Authorization header in its body; neither output shows the token."""
    hub.status = 401
    env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": hub.url, "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "distill.cli", "push", str(adapter), "--repo-id", "me/planner"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert TOKEN not in done.stdout + done.stderr
    assert "push to me/planner failed (HTTP 401)" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert [p for m, p, _ in hub.requests if m == "POST"] == ["/api/repos/create"]  # a refusal is not retried


def test_a_server_error_is_retried_then_one_line(adapter, hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setattr("distill.training.push.time.sleep", lambda s: None)
    hub.status = 503
    with pytest.raises(DistillError, match=r"HTTP 503") as info:
        push(adapter, "me/planner", endpoint=hub.url, timeout_s=10, retries=2)
    assert TOKEN not in str(info.value)
    assert [p for m, p, _ in hub.requests if m == "POST"] == ["/api/repos/create"] * 3  # 1 try + 2 retries


@pytest.mark.parametrize("setup,says", [
    (lambda a, m: m.delenv("HF_TOKEN", raising=False), "set HF_TOKEN"),
    (lambda a, m: (a / "adapter_model.safetensors").unlink(), "is not an adapter folder"),
])
def test_missing_token_or_adapter_is_one_line_before_any_request(adapter, hub, monkeypatch, setup, says):
    setup(adapter, monkeypatch)
    with pytest.raises(DistillError, match=says):
        push(adapter, "me/planner", endpoint=hub.url)
    assert hub.requests == []


def test_dry_run_writes_the_card_and_sends_nothing(adapter, hub, monkeypatch, capsys):
    from distill.cli import main

    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    assert main(["push", str(adapter), "--repo-id", "me/planner", "--dry-run"]) == 0
    assert "would upload to me/planner: adapter_config.json, adapter_model.safetensors" in capsys.readouterr().out
    assert (adapter / "README.md").is_file() and hub.requests == []


def test_a_hub_that_never_answers_is_one_line_after_the_timeout(adapter, hub, monkeypatch):
    """huggingface_hub's own client waits for ever; distill's push gives each request `timeout_s`."""
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    hub.hold = threading.Event()
    with pytest.raises(DistillError, match=r"push to me/planner failed \(ReadTimeout\)"):
        push(adapter, "me/planner", endpoint=hub.url, timeout_s=1, retries=0)
