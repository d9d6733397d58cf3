"""Is a MeshConfig's workload certificate lifetime safe? Istio's `SECRET_TTL`, checked.

Istio sets the lifetime of workload certificates with the proxies' `SECRET_TTL`, mesh-wide in
`defaultConfig.proxyMetadata`. A lifetime is unsafe in three ways, each a warning naming the field:

- it leaves less than an hour of outage: certificates are renewed with a third of their life left
  (`meshctl.security.ca.RENEW_FRACTION`), and that third is how long every replica of the control
  plane may be down before the first one expires;
- it is too short for the VMs' renewal timer (`systemd/meshctl-ca-renew@.timer`: 10 minutes after
  the last run, plus up to 5 at random): the last third must hold a whole gap between two runs,
  or a certificate can expire between them;
- it outlasts the CA (when the CA's end is known): certificates are cut at the CA's end, and all
  of them would then expire together instead of renewing spread out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final

from meshctl.config.findings import Severity
from meshctl.config.schema import parse_duration

FIELD: Final = "defaultConfig.proxyMetadata.SECRET_TTL"
#: The share of a lifetime left when a certificate is renewed (1 - `security.ca.RENEW_FRACTION`).
LEFT_AT_RENEWAL: Final = 1 / 3
#: The least outage of the whole control plane that certificates should outlast.
OUTAGE_WARNING: Final = timedelta(hours=1)
#: The longest between two runs of a VM's renewal timer (OnUnitInactiveSec + RandomizedDelaySec).
RENEWAL_TIMER_GAP: Final = timedelta(minutes=15)

Problem = Callable[[str, Severity, str], None]


def check_secret_ttl(default_config: Any, problem: Problem, ca_not_after: datetime | None = None) -> None:
    """Report, through `problem(message, severity, field)`, what is unsafe about the lifetime
    `default_config` (MeshConfig's `defaultConfig`) sets; nothing when it sets none."""
    metadata = default_config.get("proxyMetadata") if isinstance(default_config, Mapping) else None
    if not isinstance(metadata, Mapping) or "SECRET_TTL" not in metadata:
        return
    text = metadata["SECRET_TTL"]
    nanos = parse_duration(text) if isinstance(text, str) else None
    if nanos is None or nanos <= 0:
        problem(f"{FIELD} must be a positive duration (24h, 90m)", Severity.ERROR, FIELD)
        return
    lifetime = timedelta(microseconds=min(nanos // 1000, 10**17))
    left = lifetime * LEFT_AT_RENEWAL
    if left < RENEWAL_TIMER_GAP:
        problem(
            f"{FIELD} {text}: renewed with {_span(left)} left, less than the longest gap between two runs of a "
            f"VM's renewal timer ({_span(RENEWAL_TIMER_GAP)}): a certificate can expire between them; "
            f"give at least {_span(RENEWAL_TIMER_GAP / LEFT_AT_RENEWAL)}",
            Severity.WARNING,
            FIELD,
        )
    elif left < OUTAGE_WARNING:
        problem(
            f"{FIELD} {text}: certificates are renewed with a third of their life left, so the control plane "
            f"may be down only {_span(left)} before the first expires (under an hour)",
            Severity.WARNING,
            FIELD,
        )
    if ca_not_after is not None and datetime.now(ca_not_after.tzinfo) + lifetime > ca_not_after:
        problem(
            f"{FIELD} {text} is longer than the CA has left (it ends {ca_not_after.isoformat()}): certificates "
            "are cut at its end and would all expire together; renew the CA first",
            Severity.WARNING,
            FIELD,
        )


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"
