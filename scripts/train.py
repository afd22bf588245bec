"""`accelerate launch scripts/train.py --config configs/<model>_lora_<device>.yaml [--set key=value ...]`

A thin wrapper for launchers that want a script path rather than `-m distill.train` (the same code).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distill.train import launcher_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(launcher_main())
