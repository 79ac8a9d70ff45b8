"""engines._one_thread.OneThread: every call runs on one thread of its own, whichever thread makes it; results and
exceptions come back to the caller; a call made on that thread runs at once; close() ends the thread."""

from __future__ import annotations

import threading

import pytest

from engines._one_thread import OneThread


def _name():
    return threading.current_thread().name


def test_calls_from_several_threads_run_on_one_thread_of_its_own():
    one = OneThread("trtc-test-run")
    names = []
    callers = [threading.Thread(target=lambda: names.append(one.call(_name))) for _ in range(4)]
    names.append(one.call(_name))
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(names) == 5 and len(set(names)) == 1 and names[0].startswith("trtc-test-run")
    assert names[0] != _name()
    one.close()


def test_results_exceptions_and_a_call_from_inside():
    one = OneThread("trtc-test-run")
    assert one.call(lambda a, b: a * b, 6, 7) == 42
    with pytest.raises(ValueError, match="bad batch"):
        one.call(lambda: (_ for _ in ()).throw(ValueError("bad batch")))
    # a call made on the thread itself runs there at once (waiting for its own queue would never end)
    inner = []
    t = threading.Thread(target=lambda: inner.append(one.call(lambda: one.call(_name))), daemon=True)
    t.start()
    t.join(10)
    assert inner and inner[0].startswith("trtc-test-run")
    one.close()


def test_close_ends_the_thread_and_a_later_call_starts_another():
    one = OneThread("trtc-test-run")
    first = one.call(threading.current_thread)
    one.close()
    first.join(5)
    assert not first.is_alive()
    second = one.call(threading.current_thread)
    assert second is not first and second.is_alive()
    one.close()
