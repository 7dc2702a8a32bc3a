"""BackgroundCleanup: one clean-up in flight, its error surfaces at the next wait."""

import threading
import time

import pytest

from pipeline_lib.execution.runtime.background_cleanup import BackgroundCleanup


def test_one_clean_up_at_a_time_and_its_error_surfaces_at_the_next_submit():
    cleanup, done, running = BackgroundCleanup("p"), [], threading.Event()

    def slow(n):
        def work():
            running.set()
            time.sleep(0.2)
            done.append(n)

        return work

    cleanup.submit(slow(1))
    assert running.wait(5)
    cleanup.submit(slow(2))  # waits for the first before starting the second
    assert done == [1]
    cleanup.wait()
    assert done == [1, 2]

    def fail():
        raise OSError("S3 said no")

    cleanup.submit(fail)
    with pytest.raises(OSError, match="S3 said no"):
        cleanup.submit(slow(3))
    assert done == [1, 2]  # the work after a failure did not start
    cleanup.close()


def test_close_quiet_logs_the_error_instead_of_hiding_the_callers(caplog):
    cleanup = BackgroundCleanup("pipeline main")
    cleanup.submit(lambda: 1 / 0)
    cleanup.close(quiet=True)
    assert "pipeline main: clean-up after the last epoch failed too: division by zero" in caplog.text
    loud = BackgroundCleanup("q")
    loud.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        loud.close()
