"""What a windowed flow's owner tasks close its windows by in one epoch.

Late decisions use the watermark the epoch starts with (the driver has it: the snapshot's, or the
epoch before advanced by its owners' reports). Closing uses the watermark after the epoch, which
needs the epoch's largest event time over every read task: each read task sends its own to every
owner through the shuffle (owner_epochs), so each owner computes the same watermark without a
second job or a round trip through the driver, and reports it back as a count-sized value.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline_lib.execution.state.watermark import Watermark


@dataclass(frozen=True)
class WindowClock:
    """``start``: the flow's watermark as the epoch starts; ``ended``: the bounded source is read
    to its end with this epoch, so every window closes."""

    start: Watermark
    ended: bool = False

    def after(self, epoch_max_event_ms: int | None) -> Watermark:
        """The watermark after the epoch whose records' largest event time, over every read task,
        is ``epoch_max_event_ms`` (None: it had none): what the driver's merge advances it to."""
        return self.start.advanced(epoch_max_event_ms, ended=self.ended)  # guard: owner-window-clock-stuck
