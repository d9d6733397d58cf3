"""Translate, first half: the immutable snapshot, the proxy bound to its workload, and its scope."""
