"""Reading finished runs for people: where each student came from, the verdict's sentences, the question viewer
and the flywheel's round report. The report stage (`distill/report.py`) writes them."""
