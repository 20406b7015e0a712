"""A refused reload names the key that changed, down to a source option, and shows no
secret (pure: :func:`offbroadway.daemon.core.reload.differences` and the refusal's text)."""

from __future__ import annotations

from offbroadway.daemon.core.reload import _refuse, differences
from offbroadway.stages.runtime.redact import mask_value, secret_name, value_secrets

URL = "amqp://guest:Hunter-2-secret@127.0.0.1:5672/%2F"


def test_a_changed_option_is_named_by_its_dotted_key() -> None:
    old = {"url": URL, "queue": "a", "password": "Hunter-2-secret"}
    new = {"url": URL, "queue": "b", "password": "Hunter-2-secret"}
    assert differences("producer.options", old, new) == [("producer.options.queue", "a", "b")]
    text = str(_refuse("producer.options", old, new))
    assert text.startswith("producer.options.queue: cannot change"), text
    assert "running 'a', config 'b'" in text and "Hunter" not in text


def test_every_changed_option_is_named_and_secrets_are_masked() -> None:
    old = {"url": URL, "password": "Hunter-2-secret", "nested": {"api_token": "tok-123"}}
    new = {"url": URL.replace("guest:", "admin:"), "password": "Hunter-3-secret",
           "nested": {"api_token": "tok-456"}, "queue": "q"}
    text = str(_refuse("producer.options", old, new))
    for key in ("producer.options.url", "producer.options.password",
                "producer.options.nested.api_token", "producer.options.queue"):
        assert key in text, text
    for secret in ("Hunter", "tok-"):
        assert secret not in text, text
    assert "admin:***@" in text


def test_secret_names_and_values() -> None:
    assert secret_name("password") and secret_name("db_password") and secret_name("API_TOKEN")
    assert not secret_name("queue") and not secret_name("url")
    assert mask_value({"password": 123, "url": URL, "list": [URL]}) == {
        "password": "***", "url": "amqp://guest:***@127.0.0.1:5672/%2F",
        "list": ["amqp://guest:***@127.0.0.1:5672/%2F"]}
    assert set(value_secrets({"url": URL, "x": {"secret": "s3cr3t"}})) >= {
        "Hunter-2-secret", "s3cr3t"}
