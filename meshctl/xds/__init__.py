"""Translate: pure generators from a snapshot and a proxy to Envoy resources, one module per type."""
