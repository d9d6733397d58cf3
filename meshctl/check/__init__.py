"""Checks of generated config: against what a live Envoy holds (`drift`), and against itself,
names and addresses two services claim in one proxy's view (`names`, validate's MC0006).

A check reads what the generators produce (the objects `meshctl dump` prints) and what Envoy
reports, never the Istio YAML, so it cannot disagree with what the server sends.
"""
