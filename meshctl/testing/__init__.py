"""Fakes and builders that tests need and users may reuse: fake Consul, ADS client, config builders."""
