"""Renderers: pure functions from a Trace to text, JSON or HTML."""
