"""The files sink: its spec (model, spec), its writer, its store, registered in
jobs.sinks.registry. Nothing is imported here: the spec reads model.py without Spark."""
