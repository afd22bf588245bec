"""What surrounds `distill/train.py`, the TRL script: launching it on every GPU, and an adapter's life after it
(merged into full weights, pushed to the Hub)."""
