"""The relay's --batch-size, --lanes and --poll-interval are also settings; an option wins."""

from __future__ import annotations

import pytest

from consumer.cli import build_parser
from consumer.producer import relay_config
from settings import SettingsError, load_settings


def test_the_relay_settings_are_its_defaults_and_an_option_wins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parse = build_parser().parse_args
    default = relay_config(load_settings(), parse(["relay"]))
    assert (default.batch_size, default.lanes, default.poll_interval_s) == (500, 2, 1.0)
    monkeypatch.setenv("RELAY_BATCH_SIZE", "50")
    monkeypatch.setenv("RELAY_LANES", "3")
    monkeypatch.setenv("RELAY_POLL_INTERVAL_S", "0.25")
    settings = load_settings()
    from_env = relay_config(settings, parse(["relay"]))
    assert (from_env.batch_size, from_env.lanes, from_env.poll_interval_s) == (50, 3, 0.25)
    chosen = relay_config(settings, parse(["relay", "--lanes", "4", "--poll-interval", "2"]))
    assert (chosen.batch_size, chosen.lanes, chosen.poll_interval_s) == (50, 4, 2.0)
    with pytest.raises(SystemExit) as refused:  # a usage error, before anything is reached
        parse(["relay", "--poll-interval", "0"])
    assert refused.value.code == 2


@pytest.mark.parametrize(
    ("variable", "value"),
    [("RELAY_BATCH_SIZE", "0"), ("RELAY_LANES", "many"), ("RELAY_POLL_INTERVAL_S", "-1")],
)
def test_a_bad_relay_setting_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=variable):
        load_settings()
