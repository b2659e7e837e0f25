"""The storage_options users pass (s3fs, boto3 and obstore spellings) map onto obstore's S3Config,
or fail with a ConfigError naming the option (pure: no server, no request)."""

from __future__ import annotations

from typing import Any

import pytest

import zarr_skip as zs
from zarr_skip.store._s3 import open_s3_store
from zarr_skip.store._s3_config import s3_config_from_storage_options

SEAWEED = {  # what tests/_s3server.py and the README pass: s3fs's spelling
    "key": "AK",
    "secret": "SK",
    "endpoint_url": "http://127.0.0.1:9",
    "client_kwargs": {"region_name": "eu-west-1"},
    "config_kwargs": {"s3": {"addressing_style": "path"}},
}


def test_the_s3fs_spelling_maps_onto_s3config() -> None:
    config, extra, profile = s3_config_from_storage_options(SEAWEED)
    assert config == {
        "access_key_id": "AK",
        "secret_access_key": "SK",
        "endpoint": "http://127.0.0.1:9",
        "region": "eu-west-1",
        "virtual_hosted_style_request": False,
    }
    assert extra == {"client_options": {"allow_http": True}} and profile is None


@pytest.mark.parametrize(
    "options",
    [
        {"username": "AK", "password": "SK"},  # s3fs's other names
        {"aws_access_key_id": "AK", "aws_secret_access_key": "SK"},  # boto3's
        {"access_key_id": "AK", "secret_access_key": "SK"},  # obstore's
        {"client_kwargs": {"aws_access_key_id": "AK", "aws_secret_access_key": "SK"}},
    ],
)
def test_every_spelling_of_the_credentials(options: dict[str, Any]) -> None:
    config, _, _ = s3_config_from_storage_options(options)
    assert (config["access_key_id"], config["secret_access_key"]) == ("AK", "SK")


def test_anon_profile_requester_pays_and_virtual_addressing() -> None:
    config, _, profile = s3_config_from_storage_options(
        {
            "anon": "true",
            "profile": "dev",
            "requester_pays": "yes",
            "config_kwargs": {"s3": {"addressing_style": "virtual"}},
        }
    )
    assert config == {"skip_signature": True, "request_payer": True, "virtual_hosted_style_request": True}
    assert profile == "dev"


def test_s3fs_tuning_options_are_ignored() -> None:
    config, extra, _ = s3_config_from_storage_options(
        {"key": "AK", "secret": "SK", "use_listings_cache": False, "skip_instance_cache": True, "retries": 5}
    )
    assert config == {"access_key_id": "AK", "secret_access_key": "SK"} and extra == {}


def test_server_side_encryption_of_s3_additional_kwargs() -> None:
    config, _, _ = s3_config_from_storage_options(
        {"s3_additional_kwargs": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "k1", "RequestPayer": "requester"}}
    )
    assert config == {"server_side_encryption": "aws:kms", "sse_kms_key_id": "k1", "request_payer": True}
    with pytest.raises(zs.ConfigError, match=r"s3_additional_kwargs\.ACL: not supported"):
        s3_config_from_storage_options({"s3_additional_kwargs": {"ACL": "public-read"}})


def test_verify_and_use_ssl() -> None:
    _, extra, _ = s3_config_from_storage_options({"client_kwargs": {"verify": False}})
    assert extra == {"client_options": {"allow_invalid_certificates": True}}
    assert s3_config_from_storage_options({"client_kwargs": {"verify": True}, "use_ssl": True})[1] == {}
    with pytest.raises(zs.ConfigError, match=r"client_kwargs\.verify='/ca\.pem': a CA bundle path"):
        s3_config_from_storage_options({"client_kwargs": {"verify": "/ca.pem"}})
    _, extra, _ = s3_config_from_storage_options({"use_ssl": False, "endpoint_url": "http://h:9000"})
    assert extra["client_options"] == {"allow_http": True}
    with pytest.raises(zs.ConfigError, match=r"use_ssl=False needs an http:// endpoint_url"):
        s3_config_from_storage_options({"use_ssl": False, "endpoint_url": "https://h"})


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"endpoint": "http://a", "endpoint_url": "http://b"}, "endpoint"),
        ({"key": "a", "aws_access_key_id": "b"}, "access_key_id"),
        ({"region": "a", "client_kwargs": {"region_name": "b"}}, "region"),
    ],
)
def test_two_values_for_one_setting_are_refused(options: dict[str, Any], named: str) -> None:
    with pytest.raises(zs.ConfigError, match=f"two values for '{named}'"):
        s3_config_from_storage_options(options)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"endpointurl": "http://h"}, "'endpointurl'"),
        ({"session": object()}, "'session'"),
        ({"client_kwargs": {"config": object()}}, "'client_kwargs.config'"),
    ],
)
def test_an_unknown_option_is_a_config_error_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises(zs.ConfigError, match=f"unknown S3 option {named}; understood: key, secret") as err:
        s3_config_from_storage_options(options)
    assert isinstance(err.value, ValueError)
    with pytest.raises(zs.ConfigError, match=named):  # through the public door too, before any request
        zs.open_cache("s3://bucket/prefix", {"x": 1}, storage_options=options)


def test_an_s3_store_opens_without_a_request_and_pickles() -> None:
    import pickle

    store = open_s3_store("s3://bucket/a/b", SEAWEED, read_only=True)
    assert str(store).startswith("object_store://") and store.read_only
    back = pickle.loads(pickle.dumps(store))
    assert type(back) is type(store) and back.read_only and str(back) == str(store)


def test_opening_the_same_s3_location_again_reuses_its_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Making an S3 store costs milliseconds (its HTTP client) and its connections: a cache
    opened again on the same settings reuses it; other settings, environment or process make
    another, and settings that are not plain data are never shared."""
    from datetime import timedelta

    from zarr_skip.store import _s3

    first = open_s3_store("s3://bucket/a/b", SEAWEED)
    assert open_s3_store("s3://bucket/a/b", SEAWEED, read_only=True)._inner is first._inner
    assert open_s3_store("s3://bucket/a/c", SEAWEED)._inner is not first._inner
    assert open_s3_store("s3://bucket/a/b", {**SEAWEED, "secret": "other"})._inner is not first._inner
    monkeypatch.setenv("AWS_REQUEST_PAYER", "true")
    assert open_s3_store("s3://bucket/a/b", SEAWEED)._inner is not first._inner
    monkeypatch.delenv("AWS_REQUEST_PAYER")
    assert open_s3_store("s3://bucket/a/b", SEAWEED)._inner is first._inner
    timed = {**SEAWEED, "retry_config": {"max_retries": 2, "retry_timeout": timedelta(seconds=5)}}
    made = [open_s3_store("s3://bucket/a/b", timed)._inner for _ in range(2)]  # not plain data: not shared
    assert made[0] is not made[1] and made[0] is not first._inner
    monkeypatch.setattr(_s3.os, "getpid", lambda: -1)  # a forked child: its parent's clients are not its own
    assert open_s3_store("s3://bucket/a/b", SEAWEED)._inner is not first._inner
    for i in range(_s3.MADE_STORES + 1):  # at most MADE_STORES kept
        open_s3_store(f"s3://bucket/many/{i}", SEAWEED)
    assert len(_s3._MADE._stores) == _s3.MADE_STORES
