"""Alerts: the event-type table, CloudEvents, the Alertmanager mapping, sink settings."""
