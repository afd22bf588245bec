"""`accelerate launch scripts/train.py --config configs/<model>_lora_<device>.yaml [--set key=value ...]`: the same
code as `-m distill.train`, for launchers that want a script path."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distill.train import launcher_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(launcher_main())
