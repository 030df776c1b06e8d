"""The cassandra sink: its spec (model, spec), its kind of connection (connection), its writer
and store, registered in jobs.sinks.registry. Nothing is imported here."""
