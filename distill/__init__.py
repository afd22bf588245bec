"""distill: distill the Planner of a ReWOO agent from a large teacher into a small open model, and serve it."""

__version__ = "0.1.0"
