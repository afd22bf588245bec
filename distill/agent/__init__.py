"""The agents built from a config: the one factory (ReWOO and the baselines behind one call) and the planner
reward, which runs a plan through the real Worker."""
