"""LocalEngine: results in task order, whoever runs a task; the driver runs tasks while workers start."""

from __future__ import annotations

import os
import time

import pytest

from packtool.engines.local import LocalEngine

DRIVER = os.getpid()  # in a worker (which imports this module afresh): the worker's own pid


def _slow_start(delay: float, driver: int) -> None:
    if os.getpid() != driver:  # a worker: start slowly, as one importing a heavy tokenizer would
        time.sleep(delay)


def _whose(task: int) -> tuple[int, int]:
    time.sleep(0.01)
    return task, os.getpid()


def _fails_on_3(task: int) -> int:
    if task == 3:
        raise ValueError(f"task {task} failed")
    return task


def test_driver_runs_tasks_while_the_workers_start():
    with LocalEngine(2, _slow_start, (1.5, DRIVER)) as engine:
        results = list(engine.map(_whose, range(40)))
    assert [task for task, _ in results] == list(range(40))
    by_driver = [task for task, pid in results if pid == DRIVER]
    by_workers = [task for task, pid in results if pid != DRIVER]
    # the first 2 x num_proc tasks wait for the workers; the driver takes the next ones until one is done
    assert by_driver and min(by_driver) == 4
    assert set(range(4)) <= set(by_workers)


def test_no_task_runs_in_the_driver_once_the_workers_are_up():
    with LocalEngine(2, _slow_start, (0.0, DRIVER)) as engine:
        list(engine.map(_whose, range(8)))  # the workers are up after this
        results = list(engine.map(_whose, range(40)))
    assert [task for task, _ in results] == list(range(40))
    assert all(pid != DRIVER for _, pid in results)


@pytest.mark.parametrize("delay", [0.0, 1.5])
def test_a_failing_task_raises_in_task_order_wherever_it_ran(delay):
    with LocalEngine(2, _slow_start, (delay, DRIVER)) as engine:
        got = []
        with pytest.raises(ValueError, match="task 3 failed"):
            for r in engine.map(_fails_on_3, range(20)):
                got.append(r)
    assert got == [0, 1, 2]
