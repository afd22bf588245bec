"""Tools the ReWOO Worker can call: each is a `Tool` (name, description, async run(query) -> str)."""
