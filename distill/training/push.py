"""Share a trained student planner on the Hugging Face Hub, with a model card that says how to use it.

    HF_TOKEN=... distill push runs/demo/train/student --repo-id you/smollm2-rewoo-planner [--private] [--dry-run]

TRL's own card names no base model a Hub user can load and shows a chat quick-start that ignores what makes
the adapter useful: the planner prompt it was trained on and the LoRA serving. This card is written from the
adapter's own records (`distill_adapter.json`, which training fills from the SFT data's `summary.json`, and
`loss_history.json`), never from defaults: an adapter whose records do not say its prompt and tools gets no card
until they are given. Only what serving needs is uploaded (an allow-list: never checkpoints, optimizer state or
`training_args.bin`, which holds every training argument). The token is read from an environment variable and appears
nowhere: not in the card, not in a message, even when the server echoes it back.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path
from typing import Any

from distill.core import layout
from distill.core.errors import DistillError
from distill.core.secrets import mask, remember, url_refusal
from distill.llm.embedded import is_embedded
from distill.tools.registry import tool_descriptions
from distill.training.merge import ADAPTER_INFO, same_as_trained, trained_base, trained_prompt, training_record

CARD = "README.md"
# What a user needs to serve the adapter (and to see how it was made); everything else stays on the machine.
UPLOAD = ["adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja", CARD, ADAPTER_INFO,
          layout.LOSS_HISTORY]
EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def hub_base(base: str | None) -> str | None:
    """The base as a Hub user loads it: the embedded alias is SmolLM2's Hub id; a local path is not shareable."""
    if base and is_embedded(base):
        return EMBEDDED_HUB_ID
    return base if base and not base.startswith(("/", ".")) else None


def model_card_problem(folder: str | Path, prompt: str | None = None, tools: list[str] | None = None) -> str | None:
    """Why no honest card can be written for `folder` (one line), or None. The card tells users which prompt and
    tools to send; a guessed default would teach them a prompt the adapter never saw."""
    kind, names, _ = trained_prompt(folder)
    where = f"{Path(folder) / ADAPTER_INFO}"
    if prompt and kind and not same_as_trained(kind, prompt):
        return f"--student-prompt {prompt} differs from the {kind} recorded in {where}"
    if tools and names and not same_as_trained(names, tools):
        return f"--tools {','.join(tools)} differs from the {','.join(names)} recorded in {where}"
    missing = [what for what, known in (("student_prompt", kind or prompt), ("tools", names or tools)) if not known]
    if missing:
        return (f"{where} does not record {' or '.join(missing)} (the adapter's SFT data is not where it says): "
                "give them with --student-prompt KIND --tools A,B, as its `distill sft-data` run had them")
    return None


def model_card(folder: str | Path, repo_id: str | None = None, prompt: str | None = None,
               tools: list[str] | None = None) -> str:
    """The card for `folder`; without a repo_id (training writes it) it serves the local folder. Refused (one
    line) where the adapter's records do not say its prompt and tools and they are not given."""
    folder = Path(folder)
    if problem := model_card_problem(folder, prompt, tools):
        raise DistillError(f"push: {problem}")
    where = "planner" if repo_id else str(folder)
    download = f"hf download {repo_id} --local-dir planner\n" if repo_id else ""
    info = training_record(folder)
    kind, names, _ = trained_prompt(folder)
    base = hub_base(trained_base(folder))
    shown_base = base or "the base model it was trained on"
    prompt, tools = kind or prompt, names or list(tools or [])
    teacher = info.get("teacher") if isinstance(info.get("teacher"), dict) else {}
    datasets = info.get("datasets") if isinstance(info.get("datasets"), dict) else {}

    def value(x: Any, digits: int = 4) -> str:
        return "unknown" if x is None else f"{x:.{digits}f}" if isinstance(x, float) else str(x)

    rows = [
        ("base model", base or "unknown (trained on a local path)"),
        ("LoRA rank / alpha / targets", f"{value(info.get('lora_r'))} / {value(info.get('lora_alpha'))} / "
                                        f"{value(info.get('lora_target_modules'))}"),
        ("optimiser steps", value(info.get("global_step"))),
        ("effective batch", value(info.get("effective_batch_size"))),
        ("max length (tokens)", value(info.get("max_length"))),
        ("training examples (questions)",
         f"{value(info.get('train_examples'))} ({value(info.get('train_questions'))})"),
        ("validation examples", value(info.get("validation_examples"))),
        ("final train / validation loss",
         f"{value(info.get('final_train_loss'))} / {value(info.get('final_eval_loss'))}"),
        ("planner prompt, tools", f"`{prompt}`, {', '.join(tools)}"),
        ("teacher (its prompt)", f"{', '.join(teacher.get('models') or []) or 'unknown'} "
                                 f"({value(teacher.get('prompt'))})"),
        ("datasets (train / validation examples)",
         "; ".join(f"{d} ({c.get('train')} / {c.get('validation')})" for d, c in datasets.items()) or "unknown"),
        ("distill version", value(info.get("code_version"))),
    ]
    front = ["---"] + ([f"base_model: {base}"] if base else []) + [
        "library_name: peft", "pipeline_tag: text-generation",
        "tags: [distill, rewoo, planner, lora, sft, trl]", "---"]
    table = "\n".join(f"| {k} | {v} |" for k, v in rows)
    rank = info.get("lora_r") or 8
    return "\n".join(front) + (f"""

# {(repo_id or folder.name).split('/')[-1]}

A ReWOO **Planner** distilled with `distill`: a LoRA adapter on {shown_base}
that reads a question and writes the whole tool-use plan at once (`Plan: ...` / `#E1 = Wikipedia[...]` /
`#E2 = LLM[... #E1 ...]`). A Worker runs the steps and a Solver answers from the evidence: two model calls
per question, however many hops.

## Serve it

The adapter is a LoRA module on its base; serve both with vLLM, with the chat template it was trained with:

```bash
{download}vllm serve {base or 'BASE_MODEL'} --enable-lora --max-lora-rank {rank} --lora-modules planner={where} \\
    --chat-template {where}/chat_template.jinja
# or, with distill installed: distill serve --config configs/serve_planner.yaml """
f"""--set base_model={base or 'BASE_MODEL'} --set adapter={where}
```

## Prompt it as it was trained

It was trained on distill's `{prompt}` planner prompt with the tools {', '.join(tools)}; send exactly that
prompt (the same builder distill's evaluation uses), then parse the plan:

```python
from openai import OpenAI
from distill.rewoo.plan import parse_plan
from distill.rewoo.prompts import planner_messages
from distill.tools.registry import tool_descriptions

messages = planner_messages("Which country is the birthplace of the founder of Microsoft?",
                            tool_descriptions({tools!r}), "{prompt}")
client = OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="none")
text = client.chat.completions.create(model="planner", messages=messages, max_tokens=512).choices[0].message.content
print(parse_plan(text, tools={tools!r}))
```

## Training

LoRA SFT with TRL on plans a teacher wrote and the Worker verified (the filtered trajectories of `distill`):

| | |
|---|---|
{table}
""")


def write_model_card(folder: str | Path, repo_id: str | None = None, prompt: str | None = None,
                     tools: list[str] | None = None) -> Path:
    path = Path(folder) / CARD
    path.write_text(model_card(folder, repo_id, prompt, tools))
    return path


def push(folder: str | Path, repo_id: str, *, token_env: str = "HF_TOKEN", private: bool = False,
         endpoint: str | None = None, timeout_s: float = 60.0, retries: int = 3, dry_run: bool = False,
         prompt: str | None = None, tools: list[str] | None = None) -> dict:
    """Write the card, then upload the allow-listed files as one commit; a failure is one line, token masked.
    Creating the repository and committing the same files again are idempotent, so a failed try is retried."""
    folder = Path(folder)
    if retries < 0 or not 0 < timeout_s <= 3600:
        raise DistillError(f"push: retries must be >= 0 and timeout_s in (0, 3600], not {retries}, {timeout_s}")
    if not (folder / "adapter_config.json").is_file() or not (folder / "adapter_model.safetensors").is_file():
        raise DistillError(f"{folder} is not an adapter folder (adapter_config.json + adapter_model.safetensors)")
    if "/" not in repo_id or repo_id.count("/") > 1 or not all(repo_id.split("/")):
        raise DistillError(f"--repo-id must be owner/name, not {repo_id!r}")
    setting = "endpoint" if endpoint else "HF_ENDPOINT"
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    # the Hub client would send a URL's user:password in place of the token, and quote the URL in its errors
    if refusal := url_refusal(setting, endpoint, f"the environment variable --token-env names ({token_env})"):
        raise DistillError(refusal)
    write_model_card(folder, repo_id, prompt, tools)
    files = [name for name in UPLOAD if (folder / name).is_file()]
    if dry_run:
        return {"repo_id": repo_id, "files": files, "uploaded": False}
    token = os.environ.get(token_env)
    remember(token)  # `--token-env` may name a variable whose name says nothing of a secret
    if not token:
        raise DistillError(f"set {token_env} to a Hugging Face token with write access (it is read from there only)")

    try:
        import httpx2
        from huggingface_hub import HfApi, set_client_factory
        from huggingface_hub.utils._http import hf_request_event_hook
    except ImportError as exc:
        raise DistillError(f"distill push needs huggingface_hub ({exc}): pip install -e '.[local]'") from None

    # huggingface_hub's own client has no timeout: one that never answers would hang the push for ever
    set_client_factory(lambda: httpx2.Client(event_hooks={"request": [hf_request_event_hook]},
                                             follow_redirects=True, timeout=timeout_s))
    api = HfApi(endpoint=endpoint, token=token)
    for attempt in itertools.count():
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
            commit = api.upload_folder(folder_path=str(folder), repo_id=repo_id, allow_patterns=files,
                                       commit_message="distill push: the student planner adapter and its card")
            return {"repo_id": repo_id, "files": files, "uploaded": True, "url": str(getattr(commit, "commit_url", ""))}
        except Exception as exc:  # any failure of the client or the server: retried if it may pass, else one line
            status = getattr(getattr(exc, "response", None), "status_code", None)
            transient = isinstance(exc, httpx2.TransportError) or status == 429 or (status or 0) >= 500
            if not transient or attempt == retries:
                first = mask(str(exc)).strip().splitlines()
                why = f"HTTP {status}" if status else type(exc).__name__
                raise DistillError(f"push to {repo_id} failed ({why}): {first[0][:300] if first else ''}") from None
            time.sleep(min(2.0 ** attempt, 10.0))


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("adapter", help="adapter folder written by `distill train`")
    parser.add_argument("--repo-id", required=True, help="the Hub repository, owner/name (created if missing)")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    parser.add_argument("--token-env", default="HF_TOKEN", help="environment variable holding the token")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="seconds per HTTP request (default 60)")
    parser.add_argument("--dry-run", action="store_true", help="write the card and list the files; upload nothing")
    parser.add_argument("--student-prompt", choices=["fewshot", "full", "compact"],
                        help="the planner prompt it was trained on, for an adapter whose records do not say")
    parser.add_argument("--tools",
                        help="comma-separated tools it was trained on, for an adapter whose records do not say")


def main(args: argparse.Namespace) -> int:
    done = push(args.adapter, args.repo_id, token_env=args.token_env, private=args.private,
                timeout_s=args.timeout_s, dry_run=args.dry_run, prompt=args.student_prompt,
                tools=(list(tool_descriptions(t.strip() for t in args.tools.split(",") if t.strip()))
                       if args.tools else None))
    print(f"model card: {Path(args.adapter) / CARD}")
    print(("uploaded to " if done["uploaded"] else "would upload to ")
          + f"{done['repo_id']}: {', '.join(done['files'])}")
    return 0


if __name__ == "__main__":  # `python -m distill.training.push` runs its `distill` command
    from distill.cli import run_module

    run_module(__spec__.name)
