"""`up --external-devices` without a broker: which devices, what runs for them, what is printed, the live rate."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from streamtrain.cli import app
from streamtrain.config import BrokerConfig, KafkaConfig, StreamtrainConfig, load_config, parse_assignment
from streamtrain.stack.external import KAFKA_PORT, ExternalDevice, broker_port, parse_external, publish_instructions
from streamtrain.stack.launch import plan_services
from streamtrain.stack.monitor import Monitor
from streamtrain.stack.options import StackOptions
from streamtrain.stack.services import device_streams

DEVICES = ["0", "1", "2", "3"]


def test_external_devices_are_ids_of_the_run_or_all_in_rank_order() -> None:
    assert parse_external(None, DEVICES) == ()
    assert parse_external("2, 0", DEVICES) == ("0", "2")
    assert parse_external("1,1", DEVICES) == ("1",)
    assert parse_external("ALL", DEVICES) == tuple(DEVICES)
    with pytest.raises(ValueError, match=r"name devices of this run \(0, 1, 2, 3\) or 'all'; not one of them: 4, x"):
        parse_external("0,4,x", DEVICES)
    with pytest.raises(ValueError, match="name devices of this run"):
        parse_external(" , ", DEVICES)


def _sets(argv: tuple[str, ...]) -> StreamtrainConfig:
    """What a child started with `argv` loads from its --set flags (no environment)."""
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    return load_config(env={}, overrides=dict(parse_assignment(s) for s in sets))


def test_the_plan_runs_producers_only_for_the_devices_the_stack_feeds(tmp_path: Path) -> None:
    opts = StackOptions(streams=device_streams(4), out=tmp_path, seed=10, external=("0", "2"))
    assert [(i, s.device_id) for i, s in opts.produced] == [(1, "1"), (3, "3")]
    plan = plan_services(StreamtrainConfig(), opts, KafkaConfig(), None)
    assert [p.name for p in plan.producers] == ["producer-1", "producer-3"]
    assert [_sets(p.argv).producer.seed for p in plan.producers] == [11, 13]  # each keeps its place's seed
    assert plan.producer_ports == {"1": plan.producers[0].ports[0], "3": plan.producers[1].ports[0]}
    assert _sets(plan.coordinator.argv).coordinator.devices == tuple(DEVICES)  # every device is planned ...
    assert len(plan.trainers.ports) == 4  # ... and trained
    assert set(plan.monitor(DEVICES).producer_urls) == {"1", "3"}


class _Coordinator(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        status = {"devices": [{"device": "0", "arrival_rate": 42.5, "lag_records": 3}]}
        body = json.dumps(status).encode() if self.path == "/status" else b""
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def coordinator() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Coordinator)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_live_rate_of_a_device_fed_from_outside_is_what_arrives_on_its_topic(coordinator: str) -> None:
    row = Monitor(["0"], coordinator, {}, {}).snapshot().rows[0]
    assert row.rate == 42.5 and row.lag == 3


def test_instructions_say_where_to_publish_and_when_the_run_ends(tmp_path: Path) -> None:
    kafka = KafkaConfig(bootstrap_servers="127.0.0.1:9092")
    opened = [ExternalDevice(d, kafka.topics.device(d), tmp_path / f"device-{d}.env") for d in ("0", "2")]
    lines = publish_instructions(kafka, opened, "the run stops 60 s after every service is up", secure=False)
    assert lines[0] == ("external devices 0, 2: no producer of ours; publish to Kafka at 127.0.0.1:9092, topics "
                        "streamtrain.device.0, streamtrain.device.2")
    assert lines[1] == '  from Python: DeviceProducer("127.0.0.1:9092", device="0")'
    assert f"{tmp_path / 'device-0.env'} and beside it" in lines[2]
    assert lines[3].startswith("  the run stops 60 s after every service is up; then the trainers get up to "
                               "--drain-timeout seconds")
    prefixed = kafka.model_copy(update={"topic_prefix": "streamtrain.up-20260101-000000"})
    for text in ("\n".join(publish_instructions(prefixed, opened[:1], "until Ctrl-C", secure=False)),
                 "\n".join(publish_instructions(kafka, opened[:1], "until Ctrl-C", secure=True))):
        # A bootstrap string alone would miss the prefix or the login: only the settings file has them.
        assert "from Python" not in text and "device-0.env" in text
    assert "login" in "\n".join(publish_instructions(kafka, opened[:1], "until Ctrl-C", secure=True))


@pytest.mark.parametrize(("args", "words"), [
    (["--external", "0,5"], "--external-devices '0,5': name devices of this run (0, 1) or 'all'; not one of them: 5"),
    (["--external-devices", "all", "--backlog", "10"], "--external-devices with --backlog"),
    (["--external-devices", "1", "--dataset", "plaid"], "--external-devices with --dataset"),
])
def test_up_refuses_external_devices_it_cannot_run_before_starting_anything(args: list[str], words: str) -> None:
    result = CliRunner().invoke(app, ["up", "--devices", "2", *args], env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    assert words in " ".join(result.output.split())


def test_the_broker_listens_where_clients_look_first_when_it_can() -> None:
    assert broker_port(BrokerConfig(port=12345)) == 12345
    assert broker_port(BrokerConfig(port=12345), external=False) == 12345  # broker.port is honoured on every run
    assert broker_port(BrokerConfig(), external=False) == 0  # a run of its own devices only: any free port
    with socket.socket() as held:
        with contextlib.suppress(OSError):  # someone else holds 9092 now: the fallback is tested either way
            held.bind(("127.0.0.1", KAFKA_PORT))
        assert broker_port(BrokerConfig()) == 0
    assert broker_port(BrokerConfig()) in (KAFKA_PORT, 0)
