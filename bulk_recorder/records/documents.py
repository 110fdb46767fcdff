"""Brazilian taxpayer documents: CPF (people) and CNPJ (companies).

``normalize_document`` strips the usual punctuation, upper-cases, works out which kind of
document it is and checks its two check digits (DV, *digitos verificadores*).

CPF: 11 digits; each DV is ``11 - (weighted sum % 11)``, or 0 when the remainder is < 2, with
weights 10..2 for the first DV and 11..2 for the second.

CNPJ: 14 characters, the first 12 in ``[0-9A-Z]`` (the alphanumeric format the tax authority
introduced in 2026) and the last two digits. Every character is worth ``ord(c) - 48`` (so digits
keep their value and ``'A'`` is 17); the weights are 5,4,3,2,9,8,7,6,5,4,3,2 for the first DV and
6,5,4,3,2,9,8,7,6,5,4,3,2 for the second, with the same remainder rule as the CPF.

Documents made of one repeated character (``000.000.000-00``, ``11111111111111``...) pass the
arithmetic but are placeholders, so they are rejected.
"""

from __future__ import annotations

from typing import Final

__all__ = ["CNPJ", "CNPJ_LEN", "CPF", "CPF_LEN", "MAX_RAW_LEN", "PUNCTUATION", "normalize_document"]

CPF: Final = "CPF"
CNPJ: Final = "CNPJ"

CPF_LEN: Final = 11  # digits
CNPJ_LEN: Final = 14  # 12 letters or digits, then 2 check digits
# Punctuation accepted (and dropped) in formatted documents, e.g. "12.ABC.345/01DE-35".
PUNCTUATION: Final = b".-/ "
# A formatted CNPJ has 18 characters; anything much longer is not a document (and is not worth
# scanning).
MAX_RAW_LEN: Final = 64

_CPF_W1: Final[tuple[int, ...]] = (10, 9, 8, 7, 6, 5, 4, 3, 2)
_CPF_W2: Final[tuple[int, ...]] = (11, 10, 9, 8, 7, 6, 5, 4, 3, 2)
_CNPJ_W1: Final[tuple[int, ...]] = (5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)
_CNPJ_W2: Final[tuple[int, ...]] = (6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2)

FORMAT_ERROR: Final = "must be a CPF (11 digits) or CNPJ (14 characters)"


def _check_digit(total: int) -> int:
    """DV from the weighted sum of the character values: 11 - (sum % 11), 0 if that is >= 10."""
    remainder = total % 11
    return 0 if remainder < 2 else 11 - remainder


def normalize_document(raw: str) -> tuple[str, str]:
    """Return ``(normalized, "CPF" | "CNPJ")`` for a CPF or CNPJ, formatted or not.

    ``normalized`` has no punctuation and is upper case: ``"529.982.247-25"`` becomes
    ``("52998224725", "CPF")`` and ``"12.abc.345/01de-35"`` becomes ``("12ABC34501DE35", "CNPJ")``.
    Raises ``ValueError`` with a short, ASCII message (no field name) when the text is not a
    document, its check digits are wrong or all its characters are the same.
    """
    if len(raw) > MAX_RAW_LEN or not raw.isascii():
        raise ValueError(FORMAT_ERROR)
    # ASCII from here on: bytes methods do in C what a regex would (isdigit: 0-9 only;
    # isalnum after upper(): 0-9 and A-Z only).
    doc = raw.encode().translate(None, PUNCTUATION).upper()
    size = len(doc)
    if size == CPF_LEN and doc.isdigit():
        if doc.count(doc[:1]) == size:
            raise ValueError("invalid CPF (all characters identical)")
        dv1 = _check_digit(_weighted(doc, _CPF_W1))
        dv2 = _check_digit(_weighted(doc, _CPF_W2))
        kind = CPF
    elif size == CNPJ_LEN and doc[:-2].isalnum() and doc[-2:].isdigit():
        if doc.count(doc[:1]) == size:
            raise ValueError("invalid CNPJ (all characters identical)")
        dv1 = _check_digit(_weighted(doc, _CNPJ_W1))
        dv2 = _check_digit(_weighted(doc, _CNPJ_W2))
        kind = CNPJ
    else:
        raise ValueError(FORMAT_ERROR)
    if doc[-2] - 48 != dv1 or doc[-1] - 48 != dv2:
        raise ValueError(f"invalid {kind} check digits")
    return doc.decode(), kind


def _weighted(doc: bytes, weights: tuple[int, ...]) -> int:
    """The weighted sum of the values (``c - 48``) of the first ``len(weights)`` characters.

    The second DV's weights reach the first DV's position: the sum then reads the stated DV,
    not the computed one, which changes nothing, since a stated first DV that differs from the
    computed one fails the document whatever the second. One loop on integers: compiled
    (setup.py) it costs a tenth of the C calls it replaced, which is what it is written for."""
    total = 0
    for k in range(len(weights)):
        total += (doc[k] - 48) * weights[k]
    return total
