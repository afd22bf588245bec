"""What every stage stands on: config loading, the record store and the traces file, retries, a run's lifecycle
and layout, secrets, the datasets and their scoring. A module here imports no stage."""
