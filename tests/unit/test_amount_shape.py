"""rules.exact_decimal, the amount's shape in string calls, says what published.DECIMAL says."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from bulk_recorder.records.published import DECIMAL
from bulk_recorder.records.rules import exact_decimal

_FULLMATCH = re.compile(DECIMAL).fullmatch
# Digits (ASCII and others), points, signs and the odd letter, in runs around the limits.
_PIECES = st.sampled_from(
    ["0", "7", "9" * 18, "1" * 20, "1" * 21, ".", "-", "+", "e", " ", "\u0663", "²"]
)


@given(st.lists(_PIECES, max_size=6).map("".join))
@example("1" * 20 + "." + "9" * 18)  # the widest amount
@example("1" * 21)  # one integer digit too many
@example("1." + "9" * 19)  # one decimal too many
@example("1.")
@example(".5")
@example("\u0663")  # ARABIC-INDIC DIGIT THREE: isdigit, not [0-9]
@example("")
def test_exact_decimal_is_the_published_pattern(text: str) -> None:
    assert exact_decimal(text) == bool(_FULLMATCH(text))
