"""Supervision: runs of pipelines, from launch to end, and what follows a failure."""
