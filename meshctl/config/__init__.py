"""Ingest: Istio YAML files into typed, validated `Config` objects, a store, and a watcher."""
