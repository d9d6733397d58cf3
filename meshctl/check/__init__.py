"""Checks of generated config against the world: what a live Envoy holds (`drift`).

A check reads what the generators produce (the objects `meshctl dump` prints) and what Envoy
reports, never the Istio YAML, so it cannot disagree with what the server sends.
"""
