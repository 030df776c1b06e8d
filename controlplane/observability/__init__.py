"""Observability: what a pipeline has committed, how far behind it is, how busy it is."""
