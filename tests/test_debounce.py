"""The one debounce rule, driven with numbers: quiet after the last change, never later than
`max_delay` after the first, at once for changes their source debounced already."""

from __future__ import annotations

from meshctl.debounce import Debouncer


def test_a_burst_waits_for_quiet_after_its_last_change() -> None:
    burst = Debouncer(quiet=0.25, max_delay=10.0)
    assert burst.due() is None
    burst.note(1.0)
    burst.note(1.5)
    assert burst.due() == 1.75  # a quiet period after the last change, not the first
    assert burst.take() == 1.0
    assert burst.due() is None  # the next change starts a new burst


def test_a_burst_that_never_goes_quiet_is_worked_on_after_max_delay() -> None:
    burst = Debouncer(quiet=0.25, max_delay=1.0)
    for i in range(100):
        burst.note(5.0 + i / 8)  # a writer that never stops
    assert burst.due() == 6.0


def test_settled_changes_need_no_quiet_period_of_their_own() -> None:
    burst = Debouncer(quiet=2.0, max_delay=10.0)
    burst.note(3.0, settled=True)
    assert burst.due() == 3.0  # at once
    burst.note(3.5)  # one that did not wait: the quiet period again
    assert burst.due() == 5.5


def test_forcing_makes_the_burst_due_now() -> None:
    burst = Debouncer(quiet=0.1, max_delay=10.0)
    burst.force(7.0)
    due = burst.due()
    assert due is not None and due <= 7.0
