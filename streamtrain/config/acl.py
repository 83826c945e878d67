"""The principals of streamtrain's roles (`[acl]` in the TOML file, STREAMTRAIN_ACL__* in the environment)."""

from __future__ import annotations

import re
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from ..wire.topics import validate_name_part

__all__ = ["RESERVED_USERS", "AclConfig"]

#: The embedded broker's and its controller's own users: the only super users, so no role may take their names.
RESERVED_USERS = ("streamtrain-broker", "streamtrain-controller")
_NAME = re.compile(r"^[A-Za-z0-9._@-]+$")


class AclConfig(BaseModel):
    """Who each streamtrain role is when Kafka's authorizer is on, and the SCRAM passwords `acl apply` sets.

    `streamtrain acl apply` grants each principal exactly what its role needs (README, "Security"), so a
    service that runs as its role's principal can do its job and nothing else.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    admin: str = "streamtrain-admin"
    """Set-up and audit: creates the topics, the ACLs and the SCRAM users, and reads every topic back (reports)."""

    coordinator: str = "streamtrain-coordinator"
    """The coordinator: reads feedback and the device topics' offsets, writes plans, deletes truncated records."""

    trainer: str = "streamtrain-trainer"
    """Every trainer rank: reads the device topics and the plans, commits in the trainers' group, writes feedback."""

    serve: str = "streamtrain-serve"
    """The serve service: reads requests and model announcements, commits in its group, writes predictions."""

    bridge: str = "streamtrain-bridge"
    """The bridge: reads its source topics (bridge.sources), commits in its group through its transactions, writes
    the device topics and dead-letter (granted only when bridge.sources names topics)."""

    client: str = "streamtrain-client"
    """Applications that ask `serve` for predictions (`ServeClient`): write requests, read predictions."""

    producer: str = "streamtrain-producer-{device}"
    """Producers. With `{device}` in it, one principal per device, allowed to write that device's topic only;
    without, one principal (a producer host) that writes every device topic `acl apply` is given."""

    devices: tuple[str, ...] = ()
    """The devices whose topics the roles are granted (default: coordinator.devices; `--devices` overrides)."""

    passwords: dict[str, SecretStr] = Field(default_factory=dict)
    """SCRAM passwords by principal name, created or updated by `acl apply --users` (every SCRAM mechanism);
    masked wherever streamtrain prints settings. From the environment as JSON: STREAMTRAIN_ACL__PASSWORDS."""

    @field_validator("admin", "coordinator", "trainer", "serve", "bridge", "client", "producer")
    @classmethod
    def _name_is_plain(cls, value: str) -> str:
        plain = value.replace("{device}", "device")
        if not _NAME.match(plain):
            raise ValueError(f"principal name {value!r} may hold letters, digits and . _ @ - only")
        if plain.startswith(RESERVED_USERS):
            raise ValueError(f"principal name {value!r} is reserved for the broker and its controller")
        return value

    @field_validator("devices")
    @classmethod
    def _devices_are_legal(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device in value:
            validate_name_part("device id", device)
        return value

    @field_validator("passwords")
    @classmethod
    def _passwords_are_usable(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, password in value.items():
            if name.startswith(RESERVED_USERS):
                raise ValueError(f"user {name!r} is reserved for the broker and its controller")
            if len(password.get_secret_value()) < 8:
                raise ValueError(f"password of user {name!r} is shorter than 8 characters")
        return value

    @model_validator(mode="after")
    def _roles_are_distinct(self) -> Self:
        names = [self.admin, self.coordinator, self.trainer, self.serve, self.bridge, self.client]
        if len(set(names)) != len(names) or self.producer in names:
            raise ValueError("admin, coordinator, trainer, serve, bridge, client and producer must be different "
                             "principals: "
                             "a shared principal would hold the rights of both roles")
        return self

    def producer_of(self, device: str) -> str:
        """The principal that writes `device`'s topic."""
        return self.producer.replace("{device}", device)
