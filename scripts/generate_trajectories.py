#!/usr/bin/env python
"""python scripts/generate_trajectories.py --config configs/generate_teacher.yaml [--set key=value]

`distill generate`: records teacher ReWOO trajectories (rerun the same command to finish an interrupted run).
"""

import sys

from distill.cli import main

if __name__ == "__main__":
    sys.exit(main(["generate", *sys.argv[1:]]))
