"""Where a validated JWT's claims are found after the `jwt_authn` filter, for the RBAC rules that
read them (`requestPrincipals`, `request.auth.*` conditions).

Istio's proxy has its own `istio_authn` filter to turn the token into `request.auth.principal`;
upstream Envoy has not, so the claims are read where `jwt_authn` leaves them: the payload of the
token that passed, in the filter's dynamic metadata under one key whatever the issuer (a request
is authenticated by at most one of a workload's RequestAuthentication rules, as in Istio).
"""

from __future__ import annotations

from typing import Final

#: The dynamic metadata namespace `jwt_authn` writes to.
FILTER: Final = "envoy.filters.http.jwt_authn"
#: Its `payload_in_metadata` key: the verified token's claims (`iss`, `sub`, `aud`, `azp`, ...).
PAYLOAD: Final = "payload"
