"""The CLI for operators: ``api-key list --json``, a revoke of several keys asks first, and the
load commands refuse a remote target unless ``--allow-remote`` (before reaching anything)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import free_port, run_cli, run_cli_on_terminal, settings_env

pytestmark = [pytest.mark.postgres]


def test_api_key_list_json_and_a_revoke_of_several_keys_asks_first(make_settings) -> None:
    env = settings_env(make_settings())
    for _ in range(2):
        assert run_cli(["api-key", "create", "shop"], env).returncode == 0
    assert run_cli(["api-key", "create", "other"], env).returncode == 0
    listed = json.loads(run_cli(["api-key", "list", "--json"], env).stdout)
    assert sorted(k["client"] for k in listed) == ["other", "shop", "shop"]
    assert {"id", "prefix", "scopes", "created_at", "revoked_at"} <= set(listed[0])

    declined = run_cli_on_terminal(["api-key", "revoke", "shop"], env, typed="n\n")
    assert declined.returncode == 1, declined.stderr
    assert "revoke all 2 live keys of client 'shop'?" in declined.stdout
    assert all(
        k["revoked_at"] is None
        for k in json.loads(run_cli(["api-key", "list", "--json"], env).stdout)
    )

    one = next(k["id"] for k in listed if k["client"] == "other")
    assert run_cli(["api-key", "revoke", one], env).returncode == 0  # one key: no question
    assert run_cli(["api-key", "revoke", "shop", "--yes"], env).returncode == 0
    after = json.loads(run_cli(["api-key", "list", "--json"], env).stdout)
    assert all(k["revoked_at"] is not None for k in after)


def test_a_client_with_one_live_key_is_revoked_by_name_without_a_question(make_settings) -> None:
    """The question is for several live keys: a client left with one live key (its other one
    revoked already) is revoked by name at once, even with no terminal to answer."""
    env = settings_env(make_settings())
    for _ in range(2):
        assert run_cli(["api-key", "create", "solo"], env).returncode == 0
    first = json.loads(run_cli(["api-key", "list", "--json"], env).stdout)[0]["id"]
    assert run_cli(["api-key", "revoke", first], env).returncode == 0
    done = run_cli(["api-key", "revoke", "solo"], env, answer="")  # no answer to give
    assert done.returncode == 0, done.stderr
    assert "?" not in done.stdout
    assert done.stdout.count("revoked ") == 1
    after = json.loads(run_cli(["api-key", "list", "--json"], env).stdout)
    assert all(k["revoked_at"] is not None for k in after)


@pytest.mark.parametrize("command", [["publish", "--count", "1"], ["demo", "--count", "1"]])
def test_the_load_commands_refuse_a_remote_broker_unless_allowed(make_settings, command) -> None:
    # 0.0.0.0 is not a loopback address, yet a connect to it stays on this machine (a closed
    # port here): were the refusal missing, the command would fail reaching it (exit 1)
    url = f"amqp://guest:guest@0.0.0.0:{free_port()}/"
    refused = run_cli(command, settings_env(make_settings(rabbitmq_url=url)), timeout=20)
    assert refused.returncode == 2, refused.stderr
    assert "RABBITMQ_URL points at 0.0.0.0" in refused.stderr
    assert "--allow-remote" in refused.stderr
