"""One write in flight beside the work that makes the next (production scoring's Feedback beside
the next share's judging): writes in the order given, and every write's end (or error) seen
before the caller goes on."""

from __future__ import annotations

import threading
import time

import pytest

from mlflow_rag_eval._util.writer import InOrderWriter


def test_writes_run_in_order_one_at_a_time_while_the_caller_goes_on():
    log, running, release = [], [], threading.Event()

    def write(k):
        running.append(k)
        assert len(running) == 1, "two writes at once"
        if k == 0:
            assert release.wait(10)
        log.append((k, threading.current_thread().name))
        running.remove(k)

    with InOrderWriter("rag_eval_feedback") as writer:
        writer.submit(write, 0)
        # submit returned with write 0 still held: the caller (the judge) goes on meanwhile
        assert log == []
        release.set()
        writer.submit(write, 1)  # waits for write 0 first
        assert [k for k, _ in log] == [0]
        writer.submit(write, 2)
    assert [k for k, _ in log] == [0, 1, 2]  # leaving the block waited for the last
    assert all(name.startswith("rag_eval_feedback") for _, name in log)


def test_a_failed_write_is_raised_at_the_next_submit_and_nothing_after_it_is_written():
    written = []

    def write(k):
        if k == 1:
            raise RuntimeError("the store refused share 1")
        written.append(k)

    with pytest.raises(RuntimeError, match="share 1"):
        with InOrderWriter("rag_eval_feedback") as writer:
            for k in range(4):
                writer.submit(write, k)
    assert written == [0]


def test_the_last_writes_error_is_raised_when_the_block_ends():
    def write():
        time.sleep(0.05)
        raise RuntimeError("the last share's write failed")

    with pytest.raises(RuntimeError, match="last share"):
        with InOrderWriter("rag_eval_feedback") as writer:
            writer.submit(write)


def test_an_error_while_judging_waits_for_the_write_in_flight_and_is_the_one_raised():
    done = []

    def write():
        time.sleep(0.2)
        done.append("written")
        raise RuntimeError("the write's own error")

    with pytest.raises(ValueError, match="judging failed"):
        with InOrderWriter("rag_eval_feedback") as writer:
            writer.submit(write)
            raise ValueError("judging failed")
    assert done == ["written"]  # the write ended before the error left the block


def test_with_room_for_more_writes_submit_waits_only_once_that_many_are_pending():
    release, started, done = threading.Event(), [], []

    def write(k):
        started.append(k)
        assert release.wait(10)
        done.append(k)

    with InOrderWriter("rag_eval_traces", in_flight=3) as writer:
        for k in range(3):
            writer.submit(write, k)  # three pending: none of these waits
        assert done == []
        waiter = threading.Thread(target=writer.submit, args=(write, 3))
        waiter.start()
        waiter.join(0.3)
        assert waiter.is_alive()  # the fourth waits for the oldest
        release.set()
        waiter.join(10)
    assert done == [0, 1, 2, 3]


def test_writes_queued_after_a_failed_one_are_skipped_and_its_error_raised():
    release, ran = threading.Event(), []

    def write(k):
        assert release.wait(10)
        if k == 1:
            raise RuntimeError("the store refused batch 1")
        ran.append(k)

    with pytest.raises(RuntimeError, match="batch 1"):
        with InOrderWriter("rag_eval_traces", in_flight=None) as writer:
            for k in range(5):
                writer.submit(write, k)  # all queued at once: the caller never waits
            release.set()
    assert ran == [0]
