"""Service registries (ServiceEntry/WorkloadEntry files, Consul) merged into one model."""
