from __future__ import annotations

import logging

from controlplane.redaction import MASK, RedactSecretsFilter, redact


def test_it_masks_passwords_in_urls_and_key_value_pairs():
    text = "connect postgresql://app:hunter2@db/x failed; sasl_password='abc123' token=xyz"
    cleaned = redact(text)
    for secret in ("hunter2", "abc123", "xyz"):
        assert secret not in cleaned
    assert f"postgresql://app:{MASK}@db/x" in cleaned


def test_it_masks_known_secret_values_anywhere():
    assert redact("auth failed for s3cr3t-value", ["s3cr3t-value"]) == f"auth failed for {MASK}"


def test_the_logging_filter_rewrites_records(caplog):
    logger = logging.getLogger("tests.redaction")
    logger.addFilter(RedactSecretsFilter())
    try:
        with caplog.at_level(logging.INFO, logger="tests.redaction"):
            logger.info("dsn is %s", "postgresql://u:topsecret@h/db")
    finally:
        logger.filters.clear()
    assert "topsecret" not in caplog.text
