"""What every service registry offers the rest of meshctl.

A registry publishes a complete `ServiceModel` each time what it knows changes, and tells its
listeners what changed. The model is a frozen value: the aggregate registry and the snapshot take
it as is, without copying or locking. Listeners are called from the registry's own thread and
must return quickly (the server only schedules a debounced push).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from meshctl.registry.model import RegistryChange, RegistryStatus, ServiceModel

Listener = Callable[[RegistryChange], None]


class Registry(Protocol):
    """A source of services and endpoints."""

    @property
    def name(self) -> str: ...

    def model(self) -> ServiceModel:
        """The latest complete picture; never partial, never emptied by an outage."""
        ...

    def status(self) -> RegistryStatus: ...

    def subscribe(self, listener: Listener) -> None:
        """Call `listener` after each change of `model()`."""
        ...
