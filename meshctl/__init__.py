"""meshctl: Istio's traffic API for Envoy fleets on VMs and bare metal."""

__version__ = "0.1.0"
