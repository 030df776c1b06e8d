"""Definitions as code: a fleet kept in files (controlplane.fleet.documents)."""
