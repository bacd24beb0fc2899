"""``within``: an await with a deadline that passes on a cancellation even when the awaited work has
just finished, which ``asyncio.wait_for`` does not before Python 3.12 (CPython gh-86296)."""

from __future__ import annotations

import asyncio

import pytest

from genscore_core.waiting import within


def test_the_result_comes_back_within_the_deadline() -> None:
    async def main() -> int:
        return await within(asyncio.sleep(0.01, result=7), 5.0)

    assert asyncio.run(main()) == 7


def test_work_past_the_deadline_is_cancelled_and_times_out() -> None:
    async def main() -> bool:
        work = asyncio.ensure_future(asyncio.sleep(10))
        with pytest.raises(asyncio.TimeoutError):
            await within(work, 0.05)
        await asyncio.sleep(0)  # the cancellation is delivered at the work's next step
        return work.cancelled()

    assert asyncio.run(main())


def test_a_cancellation_arriving_as_the_work_finishes_is_not_lost() -> None:
    # The order is the event loop's, not timing: the awaited future gets its result and the waiting
    # task is cancelled in the same turn, before the task wakes up. asyncio.wait_for on Python < 3.12
    # returned the result here, and the cancelled caller carried on.
    async def main() -> str:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str] = loop.create_future()
        waiter = asyncio.ensure_future(within(answer, 10.0))
        await asyncio.sleep(0)  # the waiter is now waiting on the answer
        answer.set_result("scores for a caller who left")
        waiter.cancel()
        try:
            return await waiter
        except asyncio.CancelledError:
            return "cancelled"

    assert asyncio.run(main()) == "cancelled"


def test_cancelling_the_caller_cancels_the_work() -> None:
    async def main() -> bool:
        work = asyncio.ensure_future(asyncio.sleep(10))
        waiter = asyncio.ensure_future(within(work, 10.0))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        await asyncio.sleep(0)
        return work.cancelled()

    assert asyncio.run(main())
