"""One debounce rule, without a clock: the directory watcher and the snapshot builder both use it.

Changes come in bursts (an editor's write, a `git checkout`, Consul answering for many services).
Work waits until the changes have been quiet for `quiet` seconds, but never longer than
`max_delay` after the first change of the burst, however busy the inputs stay (istiod's
PILOT_DEBOUNCE_AFTER and PILOT_DEBOUNCE_MAX). A change noted `settled` was debounced by its
source already (the snapshot builder's file changes come from the watcher, which waited for the
files to settle): it starts a burst but asks for no quiet period of its own.

The caller owns the clock: it passes `now` in and sleeps until `due()` itself, so the rule is
tested with numbers, not with time.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Debouncer:
    """The state of one burst of changes."""

    quiet: float
    max_delay: float
    #: When the burst's first change was noted; None while there is no burst.
    first: float | None = None
    #: When the last change that asked for a quiet period was noted; None when none did.
    last: float | None = None

    def note(self, now: float, *, settled: bool = False) -> None:
        """A change at `now`."""
        if self.first is None:
            self.first = now
        if not settled:
            self.last = now

    def due(self) -> float | None:
        """When the burst should be worked on (None: no burst): `quiet` after its last change,
        at most `max_delay` after its first; at once when every change was settled."""
        if self.first is None:
            return None
        if self.last is None:
            return self.first
        return min(self.last + self.quiet, self.first + self.max_delay)

    def take(self) -> float | None:
        """End the burst (its work starts now); returns when it began. Changes noted from here
        on start the next burst."""
        first = self.first
        self.first = self.last = None
        return first

    def force(self, now: float) -> None:
        """Make the burst due at once (a reload asked for by hand, SIGHUP)."""
        self.note(now)
        self.first = now - self.max_delay
