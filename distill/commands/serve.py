"""distill serve --config configs/serve_planner.yaml [--set key=value ...] [--dry-run]

Starts vLLM's OpenAI server with the student planner (a LoRA module on the base model, or merged weights),
waits until it answers /health, prints the base URL and model name to use, and runs until Ctrl-C or SIGTERM,
which it forwards to the server before exiting. The server's own log goes to stderr; stdout has only the
lines below, so scripts can read them:

    base_url: http://127.0.0.1:8000/v1
    model: planner
"""

from __future__ import annotations

import argparse
import signal
import sys

from distill.config import add_config_args


def configure_parser(parser: argparse.ArgumentParser) -> None:
    add_config_args(parser, default="configs/serve_planner.yaml")
    parser.add_argument("--dry-run", action="store_true", help="check the config, print the vLLM command and exit")


def _interrupt(signum, frame) -> None:
    """SIGTERM takes the same path as Ctrl-C: stop the server, then exit."""
    raise KeyboardInterrupt


def _announce(server) -> None:
    print(f"vLLM is ready (pid {server.pid})", flush=True)
    print(f"base_url: {server.base_url}", flush=True)
    print(f"model: {server.model_name}", flush=True)
    print(
        "use it as the planner: --set planner.backend=openai "
        f"--set planner.base_url={server.base_url} --set planner.model={server.model_name}",
        flush=True,
    )
    if server.cfg.host in {"0.0.0.0", "::", ""}:
        print(f"listening on all interfaces: other machines use http://<this host>:{server.port}/v1", flush=True)
    print("Ctrl-C stops the server.", flush=True)


def main(args: argparse.Namespace) -> int:
    from distill.config import load_config
    from distill.errors import DistillError
    from distill.serve import ServeConfig, VLLMServer, build_command, detect_platform, format_command

    cfg = load_config(ServeConfig, args.config, args.set)
    if args.dry_run:
        platform = cfg.device if cfg.device != "auto" else detect_platform()
        port = cfg.port or 8000
        argv, env = build_command(cfg.model_copy(update={"port": port}), platform)
        print(format_command(argv, env))
        return 0
    server = VLLMServer(cfg, log_path=cfg.log_file, echo=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    ready = False
    try:
        server.start()
        ready = True
        _announce(server)
        code = server.wait()
        raise DistillError(f"vLLM exited by itself with code {code}; see its log above")
    except KeyboardInterrupt:
        print("stopping vLLM ...", file=sys.stderr, flush=True)
        code = server.stop()
        print("vLLM stopped" + (f" (exit code {code})" if code is not None else ""), file=sys.stderr, flush=True)
        return 0 if ready else 130
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)
