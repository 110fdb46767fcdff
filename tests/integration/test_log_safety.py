"""Nothing a client, a publisher or a setting holds leaks into what the real processes print: a
password in any form the clients accept is masked, a hostile trace header is bounded before it
is parsed, and a control character from outside cannot start a line of its own in the log."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_cli

SECRET = "s3cr3t"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app@db/x?password=s3cr3t&connect_timeout=0",  # a settings error (exit 2)
        "postgresql://app@127.0.0.1:1/x?password=s3cr3t",  # nothing listens: one line (exit 1)
        "postgresql://app:p@s3cr3t@127.0.0.1:1/x",
    ],
)
def test_migrate_never_prints_a_password_from_database_url_file(tmp_path: Path, url: str) -> None:
    (tmp_path / "db").write_text(url + "\n")
    done = run_cli(
        ["migrate"], env={"PATH": "/usr/bin:/bin", "DATABASE_URL_FILE": str(tmp_path / "db")}
    )
    assert done.returncode in (1, 2), done
    assert done.stderr.strip(), done
    assert "Traceback" not in done.stderr
    assert SECRET not in done.stdout + done.stderr, done.stderr
