"""DATABASE_URL_FILE and RABBITMQ_URL_FILE: the URLs read from files (Docker and Kubernetes
secrets), once at start-up; a variable and its _FILE twin together are a settings error."""

from __future__ import annotations

from pathlib import Path

import pytest

from settings import SettingsError, load_settings
from tests.conftest import run_cli

DB = "postgresql://recorder:s3cret@127.0.0.1:1/ledger"
MQ = "amqp://recorder:s3cret@127.0.0.1:1/"


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in ("DATABASE_URL", "RABBITMQ_URL", "DATABASE_URL_FILE", "RABBITMQ_URL_FILE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_urls_are_read_from_their_files_trailing_newline_dropped(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "db").write_text(DB + "\n")
    (tmp_path / "mq").write_text(MQ + "\r\n")
    env.setenv("DATABASE_URL_FILE", str(tmp_path / "db"))
    env.setenv("RABBITMQ_URL_FILE", str(tmp_path / "mq"))
    settings = load_settings()
    assert (settings.database_url, settings.rabbitmq_url) == (DB, MQ)


@pytest.mark.parametrize("name", ["DATABASE_URL", "RABBITMQ_URL"])
def test_a_variable_and_its_file_twin_together_are_refused_naming_both(
    env: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    (tmp_path / "secret").write_text(DB if name == "DATABASE_URL" else MQ)
    env.setenv(name, DB if name == "DATABASE_URL" else MQ)
    env.setenv(name + "_FILE", str(tmp_path / "secret"))
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert f"{name} and {name}_FILE" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_a_missing_or_empty_file_is_refused_naming_the_variable(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env.setenv("DATABASE_URL_FILE", str(tmp_path / "absent"))
    with pytest.raises(SettingsError, match="DATABASE_URL_FILE: cannot read"):
        load_settings()
    (tmp_path / "empty").write_text("\n")
    env.setenv("DATABASE_URL_FILE", str(tmp_path / "empty"))
    with pytest.raises(SettingsError, match=r"DATABASE_URL_FILE: .* is empty"):
        load_settings()


def test_a_bad_url_in_a_file_names_the_file_variable_without_the_password(
    env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "mq").write_text("http://recorder:s3cret@127.0.0.1:1/")
    env.setenv("RABBITMQ_URL_FILE", str(tmp_path / "mq"))
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "RABBITMQ_URL_FILE" in str(caught.value)
    assert "s3cret" not in str(caught.value)


def test_consume_with_a_variable_and_its_file_twin_exits_2_naming_them(tmp_path: Path) -> None:
    (tmp_path / "db").write_text(DB)
    done = run_cli(
        ["consume"],
        env={
            "PATH": "/usr/bin:/bin",
            "DATABASE_URL": DB,
            "DATABASE_URL_FILE": str(tmp_path / "db"),
        },
    )
    assert done.returncode == 2, done.stderr
    assert "DATABASE_URL and DATABASE_URL_FILE" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "latin-1"])
@pytest.mark.parametrize("name", ["DATABASE_URL", "RABBITMQ_URL"])
def test_a_secret_file_that_is_not_utf8_is_exit_2_and_one_line_naming_it(
    tmp_path: Path, name: str, encoding: str
) -> None:
    """A UTF-16 file (what some editors and PowerShell's ``>`` write), with or without its BOM,
    or Latin-1: one line naming the variable, the settings' exit code, no traceback, and never
    the URL's password."""
    url = (DB if name == "DATABASE_URL" else MQ).replace("s3cret", "s3cr\u00e9t")
    (tmp_path / "secret").write_bytes(url.encode(encoding))
    done = run_cli(
        ["migrate"], env={"PATH": "/usr/bin:/bin", name + "_FILE": str(tmp_path / "secret")}
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert f"{name}_FILE" in lines[0]
    assert "s3cr" not in done.stderr


def test_an_ascii_utf16_file_without_bom_is_refused_not_echoed(tmp_path: Path) -> None:
    """ASCII text in UTF-16-LE without a BOM is valid UTF-8 holding NUL bytes: refused as not
    UTF-8 text, never echoed (the password would show, one NUL between its letters)."""
    (tmp_path / "secret").write_bytes(DB.encode("utf-16-le"))
    done = run_cli(
        ["migrate"], env={"PATH": "/usr/bin:/bin", "DATABASE_URL_FILE": str(tmp_path / "secret")}
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    assert "DATABASE_URL_FILE" in done.stderr
    assert "not one line of UTF-8 text" in done.stderr
    assert "\\x00" not in done.stderr, done.stderr


@pytest.mark.parametrize("char", ["\x1f", "\x7f", "\x85", "\x9f"])
def test_c0_del_and_c1_controls_in_a_secret_file_are_refused_not_echoed(
    env: pytest.MonkeyPatch, tmp_path: Path, char: str
) -> None:
    """Every control character is refused, not only NUL: C0 up to 0x1F, DEL (0x7F) and the C1
    range to 0x9F (a Latin-1 or CP-1252 file read as UTF-8 may carry them), never echoed."""
    (tmp_path / "db").write_text(DB.replace("s3cret", f"s3c{char}ret"), encoding="utf-8")
    env.setenv("DATABASE_URL_FILE", str(tmp_path / "db"))
    with pytest.raises(SettingsError, match=r"DATABASE_URL_FILE: .* holds control characters"):
        load_settings()


@pytest.mark.parametrize("char", ["~", "\xa0", "\u00e9"])
def test_printable_characters_either_side_of_the_controls_are_kept(
    env: pytest.MonkeyPatch, tmp_path: Path, char: str
) -> None:
    """0x7E below DEL and 0xA0 just past the C1 range are text: the URL is read as written."""
    url = DB.replace("s3cret", f"s3c{char}ret")
    (tmp_path / "db").write_text(url + "\n", encoding="utf-8")
    env.setenv("DATABASE_URL_FILE", str(tmp_path / "db"))
    assert load_settings().database_url == url
