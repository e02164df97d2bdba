"""colabfast.loading.stages: per-thread stage clocks, summed when read."""

from __future__ import annotations

import pickle
import threading

from colabfast.loading.stages import COLLATE, DECODE, READ, WAIT, StageClock, StageTime, since


def test_every_threads_work_is_summed_also_after_it_ends():
    clock = StageClock()

    def work():
        for _ in range(100):
            clock.add(READ, 10, 2)

    for _epoch in range(3):  # reader threads come and go each epoch
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        clock.times()
    clock.add(WAIT, 5)
    assert clock.times() == {"read": StageTime(2400, 12_000 / 1e9), "wait": StageTime(1, 5 / 1e9)}
    assert len(clock._slots) <= 1  # the ended threads' counts kept as one sum


def test_collate_is_what_the_thread_did_not_spend_reading_or_decoding():
    clock = StageClock()
    start, mark = 0, clock.mark()
    clock.add(READ, 30, 4)
    clock.add(DECODE, 50, 4)
    clock.add_rest(COLLATE, start, mark, 4)  # start 0: everything since then, less the 80 ns above
    rest = clock.times()["collate"]
    assert rest.count == 4 and rest.seconds > 0


def test_since_and_pickling():
    before = {"read": StageTime(10, 1.0), "wait": StageTime(2, 0.5)}
    after = {"read": StageTime(30, 4.0), "wait": StageTime(2, 0.5), "collate": StageTime(5, 0.25)}
    assert since(after, before) == {"read": StageTime(20, 3.0), "collate": StageTime(5, 0.25)}
    clock = StageClock()
    clock.add(READ, 1)
    assert pickle.loads(pickle.dumps(clock)).times() == {}  # a worker process starts its own
