"""What runs as a server: the student planner on vLLM (and the LoRA plugin vLLM loads), the whole agent behind an
OpenAI-shaped endpoint, and the swap of the adapter it serves."""
