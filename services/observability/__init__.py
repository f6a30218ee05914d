"""Metrics, alerts and their sinks: what the control plane tells the people who run it."""
