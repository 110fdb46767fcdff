"""Each role's stop budget, from the settings; the deadline that the steps after the first share."""

from __future__ import annotations

from bulk_recorder.infra.stop_budget import CLOSE_S, FINAL_COPIES_S, StopBudget, stop_budget
from settings import Settings


def _settings(**values: float) -> Settings:
    return Settings.model_validate(values)


def test_the_recorder_budget_is_flush_then_copies_then_close() -> None:
    budget = stop_budget("consume", _settings(bulk_recorder_shutdown_timeout_s=30))
    assert budget.steps == (("flush", 30.0), ("copies", FINAL_COPIES_S), ("close", CLOSE_S))
    assert budget.total_s == 30 + 8 + 5
    short = stop_budget(
        "consume", _settings(bulk_recorder_shutdown_timeout_s=2, bulk_recorder_confirm_timeout_s=3)
    )
    assert short.step("copies") == 3.0  # a copy waits no longer than its confirm
    assert short.total_s == 10
    assert short.describe() == (
        "stop budget (consume): flush 2 s + copies 3 s + close 5 s = 10 s from SIGTERM to exit"
    )


def test_the_relay_and_api_budgets() -> None:
    s = _settings(bulk_recorder_shutdown_timeout_s=12.5)
    assert stop_budget("relay", s).steps == (("batches", 12.5), ("close", CLOSE_S))
    # uvicorn's graceful wait is whole seconds: the budget says what it really waits
    assert stop_budget("api", s).steps == (("requests", 12.0), ("close", CLOSE_S))
    assert stop_budget("api", _settings(bulk_recorder_shutdown_timeout_s=0.5)).step("requests") == 1


def test_a_grace_period_is_the_budget_and_the_margin_rounded_up() -> None:
    budget = StopBudget("relay", (("batches", 30.5), ("close", 5.0)))
    assert budget.grace_period_s() == 41
    assert budget.grace_period_s(pre_stop_s=5) == 46


def test_later_steps_get_what_is_left() -> None:
    now = [100.0]
    budget = StopBudget("consume", (("flush", 10.0), ("copies", 4.0), ("close", 5.0)))
    deadline = budget.deadline(clock=lambda: now[0])
    deadline.start()
    now[0] += 3  # the flush took 3 s: its unused 7 s go to the copies
    assert deadline.left_for("flush") == 7
    assert deadline.left_for("copies") == 11
    assert deadline.left() == 16
    assert deadline.left(reserve_s=2) == 14
    now[0] += 30  # overrun by an earlier step: nothing is left, never a negative wait
    assert deadline.left_for("copies") == 0
    assert deadline.left() == 0
    assert deadline.elapsed() == 33


def test_an_unstarted_deadline_starts_at_the_first_question() -> None:
    now = [5.0]
    deadline = StopBudget("api", (("requests", 1.0), ("close", 5.0))).deadline(clock=lambda: now[0])
    now[0] = 50.0
    assert not deadline.started
    assert deadline.left() == 6
    assert deadline.started
    deadline.start()  # the signal after the first question does not move it
    now[0] = 52.0
    assert deadline.left() == 4
