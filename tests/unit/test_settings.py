"""Settings: contract defaults, derived values, and errors that name the variable."""

from __future__ import annotations

import pytest

from settings import Settings, SettingsError, load_settings

CONTRACT_DEFAULTS = {
    "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/bulk_recorder",
    "RABBITMQ_URL": "amqp://guest:guest@127.0.0.1:5672/",
    "RABBITMQ_EXCHANGE": "bulk_recorder",
    "RABBITMQ_QUEUE": "bulk_recorder.records",
    "RABBITMQ_DELIVERY_LIMIT": 5,
    "RABBITMQ_NUMBERS_OF_WORKERS": 5,
    "RABBITMQ_NUMBERS_OF_PREFETCH": 10,
    "RABBITMQ_TRANSACTION_ASYNC": True,
    "BULK_RECORDER_ENABLED": True,
    "BULK_RECORDER_SIZE": 0,
    "BULK_RECORDER_FLUSH_TIMEOUT_MS": 100,
    "BULK_RECORDER_MAX_ROWS_PER_INSERT": 1000,
    "API_HOST": "127.0.0.1",
    "API_PORT": 8080,
    "LOG_LEVEL": "INFO",
    "LOG_FORMAT": "text",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (*CONTRACT_DEFAULTS, "METRICS_PORT"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_contract_defaults(clean_env: pytest.MonkeyPatch) -> None:
    settings = load_settings()
    for name, value in CONTRACT_DEFAULTS.items():
        assert getattr(settings, name.lower()) == value, name


def test_each_role_has_its_own_default_metrics_port(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.metrics_port is None
    assert s.for_role("consume").metrics_port == 9464  # the contract's default for the recorder
    assert s.for_role("relay").metrics_port == 9465
    assert s.for_role("migrate").metrics_port == 0  # one-shot commands listen on nothing
    clean_env.setenv("METRICS_PORT", "9500")
    assert load_settings().for_role("relay").metrics_port == 9500  # a set value wins


def test_derived_defaults(clean_env: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.bulk_mode_active
    assert s.effective_batch_size == 50  # workers x prefetch
    assert s.channel_prefetch == 300  # a batch for each of the 5 flush workers, one filling
    assert s.dead_letter_exchange == "bulk_recorder.dlx"
    assert s.dead_letter_queue == "bulk_recorder.records.dlq"
    assert s.metrics_host == "127.0.0.1"  # loopback unless asked (the image sets 0.0.0.0)


def test_environment_is_read(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("RABBITMQ_NUMBERS_OF_WORKERS", "3")
    clean_env.setenv("RABBITMQ_NUMBERS_OF_PREFETCH", "200")
    clean_env.setenv("BULK_RECORDER_SIZE", "1000")
    clean_env.setenv("LOG_FORMAT", "JSON")
    s = load_settings()
    assert s.effective_batch_size == 1000
    assert s.channel_prefetch == 4000  # (3 workers + 1) x 1000
    assert s.log_format == "json"


@pytest.mark.parametrize(
    ("async_", "enabled", "reason"),
    [
        ("false", "true", "RABBITMQ_TRANSACTION_ASYNC=false"),
        ("true", "false", "BULK_RECORDER_ENABLED=false"),
    ],
)
def test_per_message_mode(
    clean_env: pytest.MonkeyPatch, async_: str, enabled: str, reason: str
) -> None:
    clean_env.setenv("RABBITMQ_TRANSACTION_ASYNC", async_)
    clean_env.setenv("BULK_RECORDER_ENABLED", enabled)
    s = load_settings()
    assert not s.bulk_mode_active
    assert s.bulk_mode_reason == reason
    assert s.effective_batch_size == 1


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RABBITMQ_NUMBERS_OF_WORKERS", "0"),
        ("RABBITMQ_NUMBERS_OF_WORKERS", "many"),
        ("RABBITMQ_NUMBERS_OF_PREFETCH", "-1"),
        ("RABBITMQ_DELIVERY_LIMIT", "0"),
        ("BULK_RECORDER_SIZE", "-5"),
        ("BULK_RECORDER_FLUSH_TIMEOUT_MS", "0"),
        ("BULK_RECORDER_MAX_ROWS_PER_INSERT", "5000"),
        ("BULK_RECORDER_ENABLED", "perhaps"),
        ("METRICS_PORT", "70000"),
        ("DATABASE_URL", "mysql://x"),
        ("DATABASE_URL", "postgresql://u@a:5432,,b:5432/db"),
        ("DATABASE_URL", "postgresql://u@a,b/db?connect_timeout=soon"),
        ("DATABASE_URL", "postgresql://u@a,b/db?connect_timeout=0"),
        ("RABBITMQ_URL", "http://x"),
        ("LOG_FORMAT", "xml"),
        ("LOG_LEVEL", "LOUD"),
        ("API_AUTH", "maybe"),
        ("API_AUTH", "false"),
        ("BULK_RECORDER_DB_COMMAND_TIMEOUT_S", "0"),
        ("BULK_RECORDER_DB_COMMAND_TIMEOUT_S", "soon"),
        ("API_JOB_STALL_AFTER_S", "0"),
        ("API_JOB_STALL_AFTER_S", "-1"),
        ("API_JOB_STALL_AFTER_S", "a while"),
        ("API_JOB_WORKERS", "-1"),
        ("API_JOB_WORKERS", "65"),
        ("API_JOB_WORKERS", "both cores"),
    ],
)
def test_bad_value_names_the_variable(clean_env: pytest.MonkeyPatch, name: str, value: str) -> None:
    clean_env.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        load_settings()
    message = str(info.value)
    assert name in message
    assert repr(value) in message


RETENTION_WINDOWS = ("API_IDEMPOTENCY_RETENTION_DAYS", "API_JOB_RETENTION_DAYS")


@pytest.mark.parametrize("name", RETENTION_WINDOWS)
def test_a_retention_window_runs_from_1_day_to_36500(
    clean_env: pytest.MonkeyPatch, name: str
) -> None:
    """0 days would remove a record as soon as it is written (a retried request then runs
    twice); each window takes 1 to 36,500 days (a century) and nothing either side."""
    for days in (1, 36_500):
        clean_env.setenv(name, str(days))
        assert getattr(load_settings(), name.lower()) == days
    for days in (0, 36_501):
        clean_env.setenv(name, str(days))
        with pytest.raises(SettingsError, match=f"{name}: .*got '{days}'"):
            load_settings()


@pytest.mark.parametrize(("value", "expected"), [("OFF", "off"), (" On ", "on"), ("off", "off")])
def test_api_auth_is_read_in_any_case(
    clean_env: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    """As LOG_FORMAT: API_AUTH=OFF is off, not a start-up failure (its validator is its own:
    one named like the settings' ``_lower`` would be replaced by it, and OFF refused)."""
    clean_env.setenv("API_AUTH", value)
    assert load_settings().api_auth == expected


def test_database_command_timeout(clean_env: pytest.MonkeyPatch) -> None:
    """15 s unless set: how long a statement may go unanswered before it is an outage."""
    clean_env.delenv("BULK_RECORDER_DB_COMMAND_TIMEOUT_S", raising=False)
    assert load_settings().bulk_recorder_db_command_timeout_s == 15.0
    clean_env.setenv("BULK_RECORDER_DB_COMMAND_TIMEOUT_S", "2.5")
    assert load_settings().bulk_recorder_db_command_timeout_s == 2.5


def test_settings_are_immutable() -> None:
    s = Settings()
    with pytest.raises(ValueError, match="frozen"):
        s.metrics_port = 1  # type: ignore[misc]


def test_rabbitmq_url_takes_a_list_of_nodes(clean_env: pytest.MonkeyPatch) -> None:
    nodes = "amqp://u:p@10.0.0.1:5672/, amqp://u:p@10.0.0.2:5672/,amqps://u:p@10.0.0.3:5671/v"
    clean_env.setenv("RABBITMQ_URL", nodes)
    s = load_settings()
    assert s.rabbitmq_url.split(",") == [
        "amqp://u:p@10.0.0.1:5672/",
        "amqp://u:p@10.0.0.2:5672/",
        "amqps://u:p@10.0.0.3:5671/v",
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("amqp://a:5672/,", "entry 2 of 2 is empty"),
        ("amqp://a:5672/,http://b:5672/", "entry 2 of 2 does not start with amqp://"),
        ("amqp://g:secret@a:5672/,amqp://g:secret@:5672/", "entry 2 of 2 has no host"),
        ("amqp://g:secret@a:99999/", "the URL cannot be parsed"),
        ("amqp://g:secret@a:5672/;amqp://b:5672/", "holds more than one URL"),
    ],
)
def test_a_malformed_node_list_names_rabbitmq_url_and_hides_passwords(
    clean_env: pytest.MonkeyPatch, value: str, expected: str
) -> None:
    clean_env.setenv("RABBITMQ_URL", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid settings: RABBITMQ_URL:"), message
    assert expected in message, message
    assert "secret" not in message, message


# Documented defaults the code derives rather than holds (the field's default is None).
DERIVED_DEFAULTS = {"OTEL_SERVICE_NAME"}


def test_every_default_docs_settings_states_is_the_codes() -> None:
    """docs/settings.md's table gives each variable's default as a literal: the code's field
    default is that value (a bound or a retention window changed in one place only shows here)."""
    import re
    from pathlib import Path

    page = Path(__file__).resolve().parents[2] / "docs" / "settings.md"
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \| `([^`]*)` \|", page.read_text(), re.M)
    assert len(rows) >= 30, "the settings table was not found"
    differ = []
    for name, documented in rows:
        field = Settings.model_fields.get(name.lower())
        assert field is not None, f"docs/settings.md documents {name}, which no setting reads"
        if name in DERIVED_DEFAULTS:
            continue
        default = field.default
        if isinstance(default, bool):
            same = documented == str(default).lower()
        elif isinstance(default, int | float):
            same = float(documented) == float(default)
        else:
            same = documented == str(default)
        if not same:
            differ.append(f"{name}: documented {documented!r}, code {default!r}")
    assert differ == []


def test_one_queue_shard_unless_set(clean_env: pytest.MonkeyPatch) -> None:
    """RABBITMQ_QUEUE_SHARDS is 1 by default (today's one queue) and every shard is consumed."""
    for name in ("RABBITMQ_QUEUE_SHARDS", "RABBITMQ_QUEUE_SHARDS_CONSUMED"):
        clean_env.delenv(name, raising=False)
    s = load_settings()
    assert s.rabbitmq_queue_shards == 1
    assert s.rabbitmq_queue_shards_consumed == ""
    assert s.shards_consumed == ()


def test_queue_shards_run_from_1_to_64(clean_env: pytest.MonkeyPatch) -> None:
    for shards in (1, 2, 63, 64):
        clean_env.setenv("RABBITMQ_QUEUE_SHARDS", str(shards))
        assert load_settings().rabbitmq_queue_shards == shards
    for bad in ("0", "65", "-1", "three"):
        clean_env.setenv("RABBITMQ_QUEUE_SHARDS", bad)
        with pytest.raises(SettingsError, match=f"RABBITMQ_QUEUE_SHARDS: .*got '{bad}'"):
            load_settings()


def test_shard_replicas_are_every_nodes_unless_set(clean_env: pytest.MonkeyPatch) -> None:
    """RABBITMQ_QUEUE_SHARD_REPLICAS is 0 by default: no group size, a member on every node."""
    clean_env.delenv("RABBITMQ_QUEUE_SHARD_REPLICAS", raising=False)
    assert load_settings().rabbitmq_queue_shard_replicas == 0


@pytest.mark.parametrize("replicas", [0, 1, 6, 7])
def test_shard_replicas_run_from_0_to_7(clean_env: pytest.MonkeyPatch, replicas: int) -> None:
    clean_env.setenv("RABBITMQ_QUEUE_SHARD_REPLICAS", str(replicas))
    assert load_settings().rabbitmq_queue_shard_replicas == replicas


@pytest.mark.parametrize("bad", ["-1", "8", "three", ""])
def test_shard_replicas_outside_0_to_7_name_the_variable(
    clean_env: pytest.MonkeyPatch, bad: str
) -> None:
    clean_env.setenv("RABBITMQ_QUEUE_SHARD_REPLICAS", bad)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid settings: RABBITMQ_QUEUE_SHARD_REPLICAS:"), message
    assert f"got '{bad}'" in message, message


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", (1,)),
        ("1,3", (1, 3)),
        ("2-4", (2, 3, 4)),
        (" 3 , 1-2 ", (1, 2, 3)),
        ("64", (64,)),
        ("63-64", (63, 64)),
        ("5-5", (5,)),
        ("", ()),
    ],
)
def test_the_shards_consumed_are_a_list_of_numbers_and_ranges(
    clean_env: pytest.MonkeyPatch, value: str, expected: tuple[int, ...]
) -> None:
    clean_env.setenv("RABBITMQ_QUEUE_SHARDS_CONSUMED", value)
    assert load_settings().shards_consumed == expected


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("0", "shard 0 is out of range"),
        ("65", "shard 65 is out of range"),
        ("1-65", "shard 65 is out of range"),
        ("0-2", "shard 0 is out of range"),
        ("4-2", "runs backwards"),
        ("1,,3", "empty entry"),
        ("1;3", "not a shard number"),
        ("a-b", "not a shard number"),
        ("2-", "not a shard number"),
    ],
)
def test_a_bad_shard_list_names_the_variable_and_the_entry(
    clean_env: pytest.MonkeyPatch, value: str, why: str
) -> None:
    clean_env.setenv("RABBITMQ_QUEUE_SHARDS_CONSUMED", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("invalid settings: RABBITMQ_QUEUE_SHARDS_CONSUMED:"), message
    assert why in message, message
    assert repr(value) in message, message
