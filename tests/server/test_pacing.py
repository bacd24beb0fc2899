"""When the call behind a running one is taken: the device pace learned from collected calls (times
are given, not measured), and the batcher taking that call late but ahead (stepped backend)."""

from __future__ import annotations

import asyncio
import time

import pytest

from genscore_core.server.pacing import DevicePace
from tests.helpers.backends import SteppedAheadBackend, first_call_launched, job, queue, started


def test_no_history_means_take_now() -> None:
    pace = DevicePace()
    assert pace.seconds_per_token is None
    assert pace.finishes_at(1000, launched=5.0) is None
    assert pace.take_at(1000, launched=5.0) is None


def test_device_time_counts_from_the_launch_or_the_call_before_whichever_is_later() -> None:
    pace = DevicePace(lead_floor=0.0)
    # Launched at 0 on an idle device, scores back at 2: two seconds of device time.
    assert pace.collected(100, launched=0.0, ended=2.0) == pytest.approx(2.0)
    # Launched at 1, behind the call above (which ended at 2): its device time starts at 2.
    assert pace.collected(300, launched=1.0, ended=5.0) == pytest.approx(3.0)
    # Launched at 7, after the device had gone idle at 5.
    assert pace.collected(100, launched=7.0, ended=8.0) == pytest.approx(1.0)
    # Weighted by tokens: 6 s over 500 tokens, not the mean of the three calls' rates.
    assert pace.seconds_per_token == pytest.approx(6.0 / 500)
    assert pace.last_end == 8.0


def test_take_point_is_the_predicted_end_less_twice_the_longest_recent_layout() -> None:
    pace = DevicePace(history=4, lead_floor=0.01)
    pace.collected(1000, launched=0.0, ended=1.0)  # 1 ms a token
    assert pace.lead == pytest.approx(0.01)
    for seconds in (0.02, 0.05, 0.03):
        pace.laid_out(seconds)
    assert pace.lead == pytest.approx(0.01 + 2 * 0.05)
    pace.laid_out(0.01)
    pace.laid_out(0.01)  # the 0.05 is older than the last history // 2 = 2 layouts now
    assert pace.lead == pytest.approx(0.01 + 2 * 0.01)
    # Running call of 200 tokens launched at 1.5, after the device went idle at 1.0.
    assert pace.finishes_at(200, launched=1.5) == pytest.approx(1.7)
    assert pace.take_at(200, launched=1.5) == pytest.approx(1.7 - 0.03)
    # Launched at 0.5, behind the call that ended at 1.0: the device starts it at 1.0.
    assert pace.finishes_at(200, launched=0.5) == pytest.approx(1.2)


def test_only_the_last_calls_and_no_failed_ones_set_the_rate() -> None:
    pace = DevicePace(history=2)
    pace.collected(100, launched=0.0, ended=10.0)  # 0.1 s a token, soon out of the window
    pace.collected(100, launched=10.0, ended=11.0)
    pace.collected(100, launched=11.0, ended=12.0)
    assert pace.seconds_per_token == pytest.approx(0.01)
    # A failed call (no tokens counted) moves the end, not the rate.
    assert pace.collected(0, launched=12.0, ended=20.0) == pytest.approx(8.0)
    assert pace.seconds_per_token == pytest.approx(0.01)
    assert pace.finishes_at(100, launched=15.0) == pytest.approx(21.0)


class FixedPace(DevicePace):
    """Takes the call behind a running one at ``at`` (``time.perf_counter()``, set by the test), and
    notes what it was fed and asked."""

    def __init__(self, at: float) -> None:
        super().__init__()
        self.at = at
        self.fed: list[int] = []
        self.asked: list[int] = []

    def collected(self, tokens: int, launched: float, ended: float) -> float:
        self.fed.append(tokens)
        return super().collected(tokens, launched, ended)

    def take_at(self, tokens: int, launched: float) -> float | None:
        self.asked.append(tokens)
        return self.at


async def test_requests_arriving_before_the_take_point_join_the_call_laid_out_ahead() -> None:
    backend = SteppedAheadBackend()
    pace = FixedPace(at=time.perf_counter() + 3600)  # not yet
    async with started(backend, max_batch_tokens=100, max_wait_ms=0, pace=pace) as batcher:
        tasks = await first_call_launched(batcher, backend)  # the take point has not come
        tasks += await queue(batcher, [job(2)])
        tasks += await queue(batcher, [job(3)])
        await asyncio.sleep(0.05)
        assert backend.laid_out == []  # taken at launch, the next call would hold job 2 alone
        pace.at = 0.0  # the take point passes; the next arrival wakes the worker
        tasks += await queue(batcher, [job(4)])
        await backend.laid_out_calls(1)
        await backend.launch_next()  # launched behind call 1, which is still not collected
        await backend.launched_calls(2)
        assert backend.calls == []
        backend.step()
        backend.step()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert results == [[float(tag)] for tag in range(1, 5)]
    assert backend.calls == [[1], [2, 3, 4]]
    assert [tags for tags, _ in backend.laid_out] == [[2, 3, 4]]
    assert pace.asked[0] == 4  # asked with the running call's tokens
    assert pace.fed == [4, 12]  # every collected call's tokens
    assert batcher.stats.waited_batches == {0: 1, 1: 3}


def _an_hour_late() -> FixedPace:
    """A take point an hour away: only the budget or an answer lets the next call go."""
    return FixedPace(time.perf_counter() + 3600)


async def test_a_queue_that_fills_the_budget_is_taken_before_the_take_point() -> None:
    backend = SteppedAheadBackend()
    async with started(backend, max_batch_tokens=8, max_wait_ms=0, pace=_an_hour_late()) as batcher:
        tasks = await first_call_launched(batcher, backend)
        tasks += await queue(batcher, [job(2)])
        await asyncio.sleep(0.05)
        assert backend.laid_out == []
        tasks += await queue(batcher, [job(3), job(4)])  # 12 tokens queued: the budget of 8 is full
        await backend.laid_out_calls(1)
        await backend.launch_next()
        backend.step()
        backend.step()  # calls 1 and 2 answered; job 4 alone is under the budget: taken after them
        await backend.launch_next()
        backend.step()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert results == [[float(tag)] for tag in range(1, 5)]
    assert backend.calls == [[1], [2, 3], [4]]
    assert backend.laid_out[0][0] == [2, 3]


async def test_a_running_call_answered_before_the_take_point_lets_the_queue_go_next() -> None:
    backend = SteppedAheadBackend()
    async with started(backend, max_batch_tokens=100, max_wait_ms=0, pace=_an_hour_late()) as batcher:
        tasks = await first_call_launched(batcher, backend)
        tasks += await queue(batcher, [job(2), job(3)])
        backend.step()  # call 1 answered: jobs 2 and 3 are the next call, taken after it
        await backend.launch_next()
        backend.step()
        results = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert results == [[1.0], [2.0], [3.0]]
    assert backend.calls == [[1], [2, 3]]
    assert backend.laid_out == [] and batcher.stats.prepared_ahead == 0
    assert max(batcher.stats.waited_batches) == 1
