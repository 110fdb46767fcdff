"""CPF/CNPJ normalisation and check digits (bulk_recorder.records.documents)."""

from __future__ import annotations

import re
import string

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bulk_recorder.records.documents import CNPJ, CPF, normalize_document

FORMAT_ERROR = "must be a CPF (11 digits) or CNPJ (14 characters)"


def _dv(values: list[int], weights: list[int]) -> int:
    """Reference check digit, written independently of the module (plain loop, no tricks)."""
    total = 0
    for value, weight in zip(values, weights, strict=True):
        total += value * weight
    remainder = total % 11
    return 0 if remainder < 2 else 11 - remainder


def make_cpf(base: str) -> str:
    values = [int(c) for c in base]
    values.append(_dv(values, list(range(10, 1, -1))))
    values.append(_dv(values, list(range(11, 1, -1))))
    return "".join(str(v) for v in values)


def make_cnpj(base: str) -> str:
    values = [ord(c) - 48 for c in base]
    values.append(_dv(values, [5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2]))
    values.append(_dv(values, [6, 5, 4, 3, 2, 9, 8, 7, 6, 5, 4, 3, 2]))
    return base + str(values[12]) + str(values[13])


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("529.982.247-25", ("52998224725", CPF)),
        ("52998224725", ("52998224725", CPF)),
        ("529 982 247 25", ("52998224725", CPF)),
        (" 529.982.247-25 ", ("52998224725", CPF)),
        ("11.222.333/0001-81", ("11222333000181", CNPJ)),
        ("11222333000181", ("11222333000181", CNPJ)),
        ("12.ABC.345/01DE-35", ("12ABC34501DE35", CNPJ)),
        ("12ABC34501DE35", ("12ABC34501DE35", CNPJ)),
        ("12.abc.345/01de-35", ("12ABC34501DE35", CNPJ)),
    ],
)
def test_known_valid_documents(raw: str, expected: tuple[str, str]) -> None:
    assert normalize_document(raw) == expected


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("529.982.247-26", "invalid CPF check digits"),
        ("529.982.247-15", "invalid CPF check digits"),
        ("52998224752", "invalid CPF check digits"),
        ("11.222.333/0001-82", "invalid CNPJ check digits"),
        ("11.222.333/0001-18", "invalid CNPJ check digits"),
        ("12.ABC.345/01DE-36", "invalid CNPJ check digits"),
        ("12.ABD.345/01DE-35", "invalid CNPJ check digits"),
    ],
)
def test_bad_check_digits(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        normalize_document(raw)


@pytest.mark.parametrize("digit", string.digits)
def test_all_identical_cpf_rejected(digit: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid CPF \(all characters identical\)$"):
        normalize_document(digit * 11)


@pytest.mark.parametrize("digit", string.digits)
def test_all_identical_cnpj_rejected(digit: str) -> None:
    with pytest.raises(ValueError, match=r"^invalid CNPJ \(all characters identical\)$"):
        normalize_document(digit * 14)


def test_all_zero_cpf_would_pass_the_arithmetic() -> None:
    # The reason for the all-identical rule: the check digits of 000000000 are 00.
    assert make_cpf("000000000") == "00000000000"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "...",
        "5299822472",  # 10 digits
        "529982247250",  # 12 digits
        "1122233300018",  # 13
        "112223330001811",  # 15
        "5299822472A",  # 11 characters but not all digits
        "12ABC34501DE3A",  # CNPJ check digits must be digits
        "12ABC34501DE-3_",
        "12ABC345_1DE35",  # underscore is not stripped
        "529,982,247-25",  # comma is not stripped
        "529.982.247\t25",  # only spaces are stripped, not tabs
        "\u0665\u0662\u0669\u0669\u0668\u0662\u0662\u0664\u0667\u0662\u0665",  # Arabic digits
        "\uff15\uff12\uff19\uff19\uff18\uff12\uff12\uff14\uff17\uff12\uff15",  # fullwidth
        "12\u017fBC34501DE35",  # long s upper-cases to 'S': not ASCII, refused
        "529.982.247-25\x00",
        "\ud800" * 11,
        "1" * 65,
        "." * 100 + "52998224725",
    ],
)
def test_not_a_document(raw: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(FORMAT_ERROR)}$"):
        normalize_document(raw)


@given(st.text(alphabet=string.digits, min_size=9, max_size=9))
def test_generated_cpf_round_trips(base: str) -> None:
    cpf = make_cpf(base)
    if len(set(cpf)) == 1:
        return
    formatted = f"{cpf[:3]}.{cpf[3:6]}.{cpf[6:9]}-{cpf[9:]}"
    assert normalize_document(formatted) == (cpf, CPF)


@given(st.text(alphabet=string.digits + string.ascii_uppercase, min_size=12, max_size=12))
def test_generated_cnpj_round_trips(base: str) -> None:
    cnpj = make_cnpj(base)
    if len(set(cnpj)) == 1:
        return
    formatted = f"{cnpj[:2]}.{cnpj[2:5]}.{cnpj[5:8]}/{cnpj[8:12]}-{cnpj[12:]}".lower()
    assert normalize_document(formatted) == (cnpj, CNPJ)


@given(
    st.text(alphabet=string.digits + string.ascii_uppercase, min_size=12, max_size=12),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=12, max_value=13),
)
def test_changed_cnpj_check_digit_is_rejected(base: str, delta: int, position: int) -> None:
    cnpj = make_cnpj(base)
    wrong = str((int(cnpj[position]) + delta) % 10)
    tampered = cnpj[:position] + wrong + cnpj[position + 1 :]
    if len(set(tampered)) == 1:
        return
    with pytest.raises(ValueError, match=r"^invalid CNPJ check digits$"):
        normalize_document(tampered)


@given(
    st.text(alphabet=string.digits, min_size=9, max_size=9),
    st.integers(min_value=1, max_value=9),
    st.integers(min_value=9, max_value=10),
)
def test_changed_cpf_check_digit_is_rejected(base: str, delta: int, position: int) -> None:
    cpf = make_cpf(base)
    wrong = str((int(cpf[position]) + delta) % 10)
    tampered = cpf[:position] + wrong + cpf[position + 1 :]
    if len(set(tampered)) == 1:
        return
    with pytest.raises(ValueError, match=r"^invalid CPF check digits$"):
        normalize_document(tampered)


@given(st.text(max_size=40))
def test_arbitrary_text_raises_only_value_error(raw: str) -> None:
    try:
        normalized, kind = normalize_document(raw)
    except ValueError:
        return
    assert kind in (CPF, CNPJ)
    assert normalized.isascii()
    assert normalized.isalnum()
    assert len(normalized) == (11 if kind == CPF else 14)


@given(st.text(alphabet=string.digits, min_size=11, max_size=11))
def test_any_eleven_digits_pass_exactly_when_the_reference_digits_match(cpf: str) -> None:
    # The module reads the weighted sums off a base-12 number; this is the plain definition.
    if len(set(cpf)) == 1:
        return
    if make_cpf(cpf[:9]) == cpf:
        assert normalize_document(cpf) == (cpf, CPF)
    else:
        with pytest.raises(ValueError, match=r"^invalid CPF check digits$"):
            normalize_document(cpf)
