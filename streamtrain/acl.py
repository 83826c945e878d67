"""Least-privilege ACLs of streamtrain's roles, and applying them to any Kafka cluster through the admin API.

Each role is one principal (`AclConfig`) with exactly the rights its service uses, on this job's topics
(under `kafka.topic_prefix`) and the trainers' consumer group:

- producer: WRITE its device topic(s) (IdempotentWrite is implied by WRITE on a topic);
- trainer: READ the device topics and the assignments, READ the trainers' group (commits), WRITE feedback
  and dead-letter;
- coordinator: READ feedback and assignments (rebuilding its state), WRITE assignments and dead-letter,
  DESCRIBE (offsets) and DELETE (DeleteRecords) the device topics, DESCRIBE the trainers' group (lag);
- trainer (model versions): WRITE the models topic (rank 0 announces each version);
- serve: READ the requests and the models topics, READ its own group (commits), WRITE predictions;
- client (an application asking serve, `ServeClient`): WRITE requests, READ predictions (by assignment, no group);
- admin: CREATE, DESCRIBE_CONFIGS and READ every topic under the prefix, DESCRIBE the trainers' group,
  ALTER and DESCRIBE the cluster (ACLs, SCRAM users);
- bridge (only when `bridge.sources` names topics): READ its source topics and its group, WRITE the device
  topics and dead-letter, WRITE its transactional ids (`<bridge group>.*`); the admin also READs the sources
  and DESCRIBEs the bridge's group (accounting). With the sources on another cluster (`bridge.source_cluster`,
  whose own ACLs are its owner's: READ on the source topics), it READs, CREATEs and ALTERs (grows) their twins
  `<prefix>.bridge-offsets.<topic>` here instead of READing the sources.

Nobody else may write plans, feedback, model announcements or predictions, or delete records: with the broker's
authorizer on, a request no ACL allows is refused. `apply_acls` is idempotent (it creates what is missing and
reports what was already there) and leaves every other principal's ACLs alone; ACLs of these principals on this
job's resources that are not in the set are reported as extra and removed only when asked (`prune`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from streamtrain import scram

from .authz import raise_if_refused
from .config import StreamtrainConfig
from .kafka import TopicSpec, config_of, ensure_topics

__all__ = [
    "Acl",
    "AclPlan",
    "apply_acls",
    "apply_users",
    "concerns_job",
    "create_topics",
    "describe_acls",
    "plan_acls",
    "require_cluster",
    "role_acls",
    "role_principals",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, order=True)
class Acl:
    """One ALLOW (or DENY) rule: `principal` may `operation` on a resource, as Kafka stores it."""

    principal: str
    operation: str
    resource_type: str
    """TOPIC, GROUP, TRANSACTIONAL_ID, or BROKER (the admin API's name for Kafka's cluster resource,
    "kafka-cluster")."""
    pattern: str
    resource: str
    host: str = "*"
    permission: str = "ALLOW"
    role: str = field(default="", compare=False)
    """The streamtrain role it belongs to ("" for an ACL that is not one of streamtrain's)."""

    def binding(self) -> AclBinding:
        """The admin API's form of this rule."""
        return AclBinding(ResourceType[self.resource_type], self.resource, ResourcePatternType[self.pattern],
                          self.principal, self.host, AclOperation[self.operation],
                          AclPermissionType[self.permission])

    @classmethod
    def of(cls, binding: AclBinding, role: str = "") -> Acl:
        """A rule read back from the cluster."""
        return cls(binding.principal, _name(binding.operation), _name(binding.restype),
                   _name(binding.resource_pattern_type), binding.name, binding.host, _name(binding.permission_type),
                   role)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _name(value: object) -> str:
    # The admin API converts what it returns to its enums; the stubs also allow the raw str / int forms.
    return value.name if isinstance(value, Enum) else str(value)


def role_acls(cfg: StreamtrainConfig, devices: Sequence[str]) -> list[Acl]:
    """Every ACL streamtrain's roles need for this job (prefix, trainers' group) and these devices.

    Raises:
        ValueError: when no device is given (producers and trainers are granted device topics by name).
    """
    if not devices:
        raise ValueError("name the devices whose topics the roles may use: --devices 0,1,2 (or acl.devices, "
                         "coordinator.devices)")
    roles = cfg.acl
    topics = cfg.kafka.topics
    prefix = f"{cfg.kafka.topic_prefix}."
    group = cfg.trainer_group_id
    out: list[Acl] = []

    def allow(role: str, name: str, operation: str, kind: str, resource: str, pattern: str = "LITERAL") -> None:
        out.append(Acl(f"User:{name}", operation, kind, pattern, resource, role=role))

    for device in devices:
        allow("producer", roles.producer_of(device), "WRITE", "TOPIC", topics.device(device))
        allow("trainer", roles.trainer, "READ", "TOPIC", topics.device(device))
        allow("coordinator", roles.coordinator, "DESCRIBE", "TOPIC", topics.device(device))
        allow("coordinator", roles.coordinator, "DELETE", "TOPIC", topics.device(device))
    allow("trainer", roles.trainer, "READ", "TOPIC", topics.assignments)
    allow("trainer", roles.trainer, "WRITE", "TOPIC", topics.feedback)
    allow("trainer", roles.trainer, "WRITE", "TOPIC", topics.dead_letter)
    allow("trainer", roles.trainer, "READ", "GROUP", group)
    allow("trainer", roles.trainer, "WRITE", "TOPIC", topics.models)
    allow("serve", roles.serve, "READ", "TOPIC", topics.requests)
    allow("serve", roles.serve, "READ", "TOPIC", topics.models)
    allow("serve", roles.serve, "WRITE", "TOPIC", topics.predictions)
    allow("serve", roles.serve, "READ", "GROUP", cfg.serve_group_id)
    allow("client", roles.client, "WRITE", "TOPIC", topics.requests)
    allow("client", roles.client, "READ", "TOPIC", topics.predictions)
    allow("coordinator", roles.coordinator, "READ", "TOPIC", topics.feedback)
    allow("coordinator", roles.coordinator, "READ", "TOPIC", topics.assignments)
    allow("coordinator", roles.coordinator, "WRITE", "TOPIC", topics.assignments)
    allow("coordinator", roles.coordinator, "WRITE", "TOPIC", topics.dead_letter)
    allow("coordinator", roles.coordinator, "DESCRIBE", "GROUP", group)
    for operation in ("CREATE", "DESCRIBE_CONFIGS", "READ"):
        allow("admin", roles.admin, operation, "TOPIC", prefix, "PREFIXED")
    allow("admin", roles.admin, "DESCRIBE", "GROUP", group)
    allow("admin", roles.admin, "ALTER", "BROKER", "kafka-cluster")
    allow("admin", roles.admin, "DESCRIBE", "BROKER", "kafka-cluster")
    if cfg.bridge.sources:
        out += _bridge_acls(cfg, devices)
    return sorted(set(out))


def _bridge_acls(cfg: StreamtrainConfig, devices: Sequence[str]) -> list[Acl]:
    """The bridge's rights (and the admin's, to account for its sources): granted only when it has sources.

    The bridge reads its source topics and commits in its group through its transactions (TxnOffsetCommit: READ
    on the group), writes the device topics and dead letters, and uses transactional ids under its group's name
    (one per instance). The admin reads the sources and the group's offsets back for the run report.
    """
    bridge, admin, group = cfg.acl.bridge, cfg.acl.admin, cfg.bridge.group(cfg.job)
    if cfg.bridge.source_cluster is not None:  # the sources are read elsewhere; their twins hold the offsets here
        twins = [cfg.kafka.topics.bridge_offsets(s.topic) for s in cfg.bridge.sources]
        out = [Acl(f"User:{bridge}", op, "TOPIC", "LITERAL", t, role="bridge")
               for t in twins for op in ("READ", "CREATE", "ALTER")]
    else:
        out = [Acl(f"User:{bridge}", "READ", "TOPIC", "LITERAL", s.topic, role="bridge") for s in cfg.bridge.sources]
    out += [Acl(f"User:{bridge}", "WRITE", "TOPIC", "LITERAL", cfg.kafka.topics.device(d), role="bridge")
            for d in devices]
    out += [Acl(f"User:{bridge}", "WRITE", "TOPIC", "LITERAL", cfg.kafka.topics.dead_letter, role="bridge"),
            Acl(f"User:{bridge}", "READ", "GROUP", "LITERAL", group, role="bridge"),
            Acl(f"User:{bridge}", "WRITE", "TRANSACTIONAL_ID", "PREFIXED", f"{group}.", role="bridge"),
            Acl(f"User:{admin}", "DESCRIBE", "GROUP", "LITERAL", group, role="admin")]
    if cfg.bridge.source_cluster is None:  # else read on their own cluster, as its owner allows
        out += [Acl(f"User:{admin}", "READ", "TOPIC", "LITERAL", s.topic, role="admin") for s in cfg.bridge.sources]
    return out


def concerns_job(acl: Acl, cfg: StreamtrainConfig) -> bool:
    """Whether an ACL is about this job's resources (its topics and the bridge's sources, the trainers' and the
    bridge's groups, the bridge's transactional ids)."""
    bridge_group = cfg.bridge.group(cfg.job)
    if acl.resource_type == "TOPIC":
        return (acl.resource.startswith(f"{cfg.kafka.topic_prefix}.")
                or acl.resource in {s.topic for s in cfg.bridge.sources})
    if acl.resource_type == "GROUP":
        return acl.resource in (cfg.trainer_group_id, cfg.serve_group_id, bridge_group)
    if acl.resource_type == "TRANSACTIONAL_ID":
        return acl.resource.startswith(f"{bridge_group}.")
    return False


def require_cluster(admin: AdminClient, operation: str, why: str, timeout: float = 30.0) -> None:
    """Raise `AuthorizationError` unless the client's principal may `operation` on the cluster.

    A DescribeAcls the principal may not make comes back as an empty list, not an error, which would read as
    "no ACLs at all"; the cluster's authorized operations say it plainly.
    """
    found = admin.describe_cluster(include_authorized_operations=True, request_timeout=timeout).result(timeout)
    allowed = {_name(op) for op in found.authorized_operations or ()}
    if operation not in allowed and "ALL" not in allowed:
        raise_if_refused(config_of(admin), KafkaError(KafkaError.CLUSTER_AUTHORIZATION_FAILED), operation,
                         f"kafka-cluster ({why})", "cluster")


def describe_acls(admin: AdminClient, timeout: float = 30.0) -> list[Acl]:
    """Every ACL on the cluster, sorted.

    Raises:
        AuthorizationError: when the client's principal may not DESCRIBE the cluster.
    """
    require_cluster(admin, "DESCRIBE", "to list ACLs", timeout)
    # None matches any name, principal and host (the stubs do not say so).
    every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,  # type: ignore[arg-type]
                             AclOperation.ANY, AclPermissionType.ANY)
    try:
        found = admin.describe_acls(every, request_timeout=timeout).result(timeout=timeout)
    except KafkaException as exc:
        raise_if_refused(config_of(admin), exc.args[0], "DESCRIBE", "kafka-cluster (to list ACLs)", "cluster")
        raise
    return sorted(Acl.of(b) for b in found)


@dataclass
class AclPlan:
    """What applying the roles' ACLs does: `create` is missing, `present` is there, `extra` is more than needed.

    `extra` holds ACLs of the roles' principals on this job's resources that no role needs (a device dropped,
    a right granted by hand); `removed` those `apply_acls(prune=True)` deleted.
    """

    create: list[Acl]
    present: list[Acl]
    extra: list[Acl]
    removed: list[Acl] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.create or self.removed)

    def rows(self) -> list[tuple[str, Acl]]:
        """(status, ACL) for every ACL, for a table."""
        pruned = set(self.removed)
        return ([("created", a) for a in self.create] + [("present", a) for a in self.present]
                + [("removed" if a in pruned else "extra", a) for a in self.extra])


def plan_acls(wanted: Iterable[Acl], existing: Iterable[Acl], cfg: StreamtrainConfig) -> AclPlan:
    """Compare the roles' ACLs with what the cluster holds (a pure function: nothing is changed)."""
    want = {a: a for a in wanted}
    have = set(existing)
    principals = {a.principal: a.role for a in want}
    extra = sorted(Acl(**{**a.to_dict(), "role": principals[a.principal]}) for a in have
                   if a.principal in principals and a not in want and concerns_job(a, cfg))
    return AclPlan(create=sorted(a for a in want if a not in have), present=sorted(want[a] for a in want if a in have),
                   extra=extra)


def apply_acls(admin: AdminClient, cfg: StreamtrainConfig, devices: Sequence[str], prune: bool = False,
               dry_run: bool = False, timeout: float = 30.0) -> AclPlan:
    """Create the roles' missing ACLs (and with `prune` delete their extra ones); idempotent.

    Args:
        admin: a client whose principal may ALTER and DESCRIBE the cluster (a super user, or the admin role).
        cfg: prefix, trainers' group and role principals.
        devices: the devices whose topics the roles are granted.
        prune: also delete `extra` ACLs.
        dry_run: change nothing, only say what would change.
        timeout: seconds per admin request.

    Returns:
        What was (or, on a dry run, would be) created, found and removed.

    Raises:
        AuthorizationError: when the client's principal may not list or change ACLs.
        ValueError: when no device is given.
    """
    plan = plan_acls(role_acls(cfg, devices), describe_acls(admin, timeout), cfg)
    if not dry_run and (plan.create or prune):
        require_cluster(admin, "ALTER", "to change ACLs", timeout)
    if dry_run:
        plan.removed = list(plan.extra) if prune else []
        return plan
    if plan.create:
        futures = admin.create_acls([a.binding() for a in plan.create], request_timeout=timeout)
        for binding, future in futures.items():
            try:
                future.result(timeout=timeout)
            except KafkaException as exc:
                raise_if_refused(config_of(admin), exc.args[0], "ALTER", "kafka-cluster (to create ACLs)",
                                 "cluster")
                raise KafkaException(exc.args[0]) from exc
            logger.debug("ACL created: %s", binding)
    if prune and plan.extra:
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type) for b in (a.binding() for a in plan.extra)]
        for future in admin.delete_acls(filters, request_timeout=timeout).values():
            future.result(timeout=timeout)
        plan.removed = list(plan.extra)
    return plan


def role_principals(cfg: StreamtrainConfig, devices: Sequence[str]) -> dict[str, str]:
    """User name -> role, for every principal the roles use with these devices."""
    names = {cfg.acl.admin: "admin", cfg.acl.coordinator: "coordinator", cfg.acl.trainer: "trainer",
             cfg.acl.serve: "serve", cfg.acl.client: "client"}
    if cfg.bridge.sources:
        names[cfg.acl.bridge] = "bridge"
    names |= {cfg.acl.producer_of(d): "producer" for d in devices}
    return names


def apply_users(admin: AdminClient, cfg: StreamtrainConfig, devices: Sequence[str], timeout: float = 30.0) -> list[str]:
    """Create or update the SCRAM user of every role principal that has a password in `acl.passwords`.

    Returns:
        The users written, sorted.

    Raises:
        ValueError: when a password is still a "change-me" placeholder.
        AuthorizationError: when the client's principal may not ALTER the cluster.
    """
    principals = role_principals(cfg, devices)
    users = {name: pw.get_secret_value() for name, pw in cfg.acl.passwords.items() if name in principals}
    own = config_of(admin)
    if own is not None and own.sasl_username and own.sasl_password is not None:
        users_and_self = {**users, own.sasl_username: own.sasl_password.get_secret_value()}
    else:
        users_and_self = users
    # A published default password is no password: refuse to set up users (or to run as a super user) with one.
    placeholders = sorted(n for n, pw in users_and_self.items() if pw.lower().startswith("change-me"))
    if placeholders:
        raise ValueError(f"the password of {', '.join(placeholders)} is still a change-me placeholder: set real "
                         "ones (acl.passwords, kafka.sasl_password; in Compose, the *_PASSWORD values in .env)")
    try:
        scram.upsert_users(admin, users, timeout)
    except KafkaException as exc:
        raise_if_refused(config_of(admin), exc.args[0], "ALTER", "kafka-cluster (to set SCRAM users)", "cluster")
        raise
    return sorted(users)


def create_topics(admin: AdminClient, cfg: StreamtrainConfig, devices: Sequence[str],
                  timeout: float = 30.0) -> list[str]:
    """Create this job's topics (device topics, feedback, assignments, dead-letter, evaluations, and the model-out
    topics: models, requests, predictions) that do not exist yet.

    With ACLs on, only the admin role may create topics; every service then finds its topics in place.
    """
    topics = cfg.kafka.topics
    names = [*(topics.device(d) for d in devices), topics.feedback, topics.assignments, topics.dead_letter,
             topics.evaluations, topics.models, topics.requests, topics.predictions]
    return ensure_topics(admin, [TopicSpec.from_config(cfg.kafka, n) for n in names], timeout)
