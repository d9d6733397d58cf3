"""Mesh config kept in Consul KV: followed as a config source (`source`) and written by `meshctl kv push`
(`push`). Above `registry/`, whose Consul transport it shares."""
