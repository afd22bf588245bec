"""distill: distill the Planner of a ReWOO agent from a large teacher into a small open model, and serve it."""

__version__ = "0.1.0"


def code_version() -> str:
    """`0.1.0+<commit>` when this package is imported from a git checkout of distill, else `0.1.0`: a manifest
    (and `distill --version`) must say which code made a run, and an installed copy inside some other repository
    must not borrow that repository's commit."""
    import subprocess
    from pathlib import Path

    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5, cwd=here).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    if len(out) == 2 and Path(out[0]).resolve() / "distill" == here:
        return f"{__version__}+{out[1]}"
    return __version__
