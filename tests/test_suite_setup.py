"""`make test` runs the suite in pytest-xdist workers and counts on `--dist loadgroup` to keep each group of the
shared vLLM server's tests in one worker: one server start per group instead of one per test module's worker. A pytest or xdist
upgrade that breaks the grouping would cost a server start and a minute of both cores without failing anything
else, so an inner pytest run with the project's conftest checks it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import json, os, pytest

@pytest.fixture
def vllm_server():  # stands in for the real server: this run checks where the tests land, not what they do
    return None

def _note(name):
    with open("where.jsonl", "a") as f:
        f.write(json.dumps({"test": name, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
                            "threads": os.environ.get("OMP_NUM_THREADS")}) + "\\n")

@pytest.mark.parametrize("i", range(6))
def test_uses_the_server(vllm_server, i):
    _note(f"server{i}")

@pytest.mark.parametrize("i", range(6))
def test_without_a_server(i):
    _note(f"plain{i}")
'''


def test_the_shared_servers_tests_run_in_one_worker_and_each_worker_gets_its_share_of_threads(tmp_path):
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_inner.py").write_text(INNER)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
                          "--dist", "loadgroup", "test_inner.py"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "where.jsonl").read_text().splitlines()]
    assert len(rows) == 12
    server_workers = {r["worker"] for r in rows if r["test"].startswith("server")}
    assert len(server_workers) == 1 and None not in server_workers, rows
    assert {r["worker"] for r in rows} == {"gw0", "gw1"}, rows  # the other tests still spread over both
    assert all(r["threads"] and int(r["threads"]) >= 1 for r in rows), rows
