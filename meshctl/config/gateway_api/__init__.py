"""The Kubernetes Gateway API, served by translating it into Istio's own model.

Istio's pilot turns Gateway API resources into Istio Gateways and VirtualServices before
anything else reads them (pilot/pkg/config/kube/gateway); meshctl does the same, in one step
between the config store and the snapshot (`snapshot.model.build_snapshot` calls `translate`),
so every generator, `dump`, `diff`, `simulate` and the routing tests read Gateway API config
as the Istio config it stands for. The modules, in the order the translation uses them:

- `reader` and `model`: the documents read into typed values, and the Gateway API's own validation;
- `references`: ReferenceGrants and what a backendRef names;
- `listeners`: a Gateway's listeners as Istio Gateways, and which routes each takes;
- `routes`: route rules as VirtualService routes;
- `status`: the conditions Istio would write, as findings;
- `translate`: the whole step.
"""

from meshctl.config.gateway_api.translate import (
    KINDS,
    Translation,
    is_synthetic,
    translate,
    with_translation,
)

__all__ = ["KINDS", "Translation", "is_synthetic", "translate", "with_translation"]
