"""Exact decimal arithmetic for amounts, at the contract's full precision and beyond.

An amount carries up to 38 significant digits (20 integer, 18 decimal: ``numeric(38,18)``), and
Python's default context rounds every result to 28. ``-amount`` and ``a + b`` in that context
rounded a debit of 1234567890123456.123456789012345678 to ...789012 and a valid
99999999999999999999.999999999999999999 to -1E+20, so the ledger stopped balancing. Every
computation on an amount goes through here: negation by ``copy_negate`` (exact, no context),
sums in a context as wide as the decimal module allows, where rounding is an error, never a
silent change.
"""

from __future__ import annotations

from decimal import (
    MAX_EMAX,
    MAX_PREC,
    MIN_EMIN,
    Context,
    Decimal,
    DivisionByZero,
    Inexact,
    InvalidOperation,
    Overflow,
    Rounded,
)
from typing import Final

from bulk_recorder.records.contract import Operation

ZERO: Final = Decimal(0)
# Addition in it is exact (a result takes only the digits it needs); the traps make any
# rounding raise instead of changing a balance.
EXACT: Final = Context(
    prec=MAX_PREC,
    Emax=MAX_EMAX,
    Emin=MIN_EMIN,
    traps=[InvalidOperation, DivisionByZero, Overflow, Inexact, Rounded],
)
add: Final = EXACT.add


def signed(op: Operation) -> Decimal:
    """The operation's effect on its account's balance: credits add, debits subtract."""
    return op.amount if op.type == "CREDIT" else op.amount.copy_negate()
