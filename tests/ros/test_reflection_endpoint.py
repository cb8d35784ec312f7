"""Issue 6, Show 4: the reflection endpoint is down, the requests wait in the persistent outbox and are
sent when it comes back; and requests in the outbox survive the node being killed. Issue 16: the node
buffers what was perceived, cuts the hindsight observation of the failed decision once its 6 s horizon
has passed, and the LLM's revision is written only because it agrees with the hindsight check.

Real parts: the ``reflection_client`` node in its own process over DDS (map, route, odometry and
objects published to it as the stack would), the openai client inside it speaking HTTP to a real server
on 127.0.0.1, the durable outbox journal and a real MiniLM memory bank. The server is a small stdlib
``http.server`` speaking the OpenAI chat-completions API and answering with the decision the prompt
names as best: a fake LLM, because no reasoning model can run here (hence "fake_llm" in the test
names). Before it starts, nothing listens on the port (connection refused).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticStatus
from std_msgs.msg import UInt64

import luna_msgs.msg as lm
from luna_core import types as T
from luna_core.memory.bank import MemoryBank, stored_version
from luna_core.memory.journal import scan
from luna_core.prompts import PromptManager
from luna_core.reflection import Outbox, ReflectionRequest, audit_reflections
from luna_msgs_py import convert as C
from luna_msgs_py import qos
from tests import samples
from tests.heuristic_fixtures import make_bank
from tests.ros.helpers import Probe, StalledCarTraffic, ros_env, stop_process, wait_for_subscribers

KEY_ENV, SECRET = "LUNA_TEST_REFLECTION_KEY", "sk-test-not-a-real-key-5f3a"


def _answer(code: str) -> str:
    return f"Recommended decisions: {code}\nExplanations:\n- {code}: slow down, the gap ahead is closing."


def _follow_the_hindsight(prompt: str) -> str:
    """The fake LLM's answer: the decision the prompt names as the best one in hindsight."""
    return _answer(re.search(r"is ([A-Z]{2}): rank it first", prompt).group(1))


class FakeLLMServer:
    """OpenAI chat-completions on 127.0.0.1:<port>: answers every request with a revision ranking first the
    decision the prompt names as best in hindsight, and records what it received."""

    def __init__(self, port: int) -> None:
        self.requests: list[dict] = []
        self.auth: list[str] = []
        self.answers: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self.send_error(404)
                    return
                server.requests.append(body)
                server.auth.append(self.headers.get("Authorization", ""))
                answer = _follow_the_hindsight(body["messages"][-1]["content"])
                server.answers.append(answer)
                data = json.dumps({
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "created": int(time.time()),
                    "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": answer}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_client(tmp_path: Path, bank: Path, port: int) -> subprocess.Popen:
    params = {"memory_bank": str(bank), "outbox": str(tmp_path / "outbox"),
              "endpoint": f"http://127.0.0.1:{port}/v1", "model": "fake-reasoner", "api_key_env": KEY_ENV,
              "timeout": 2.0, "backoff_base": 0.2, "backoff_max": 1.0}
    path = tmp_path / "reflection_client.yaml"
    path.write_text(yaml.safe_dump({"reflection_client": {"ros__parameters": params}}))
    env = ros_env({KEY_ENV: SECRET, "LUNA_DATA": str(tmp_path / "data")})
    return subprocess.Popen([str(Path(sys.executable).parent / "reflection_client"), "--ros-args", "--params-file",
                             str(path)], env=env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _events(stamp: float, collision: bool):
    """A failure under AK at ``stamp`` (its decision 0.5 s earlier) and its explanation."""
    query = PromptManager().decision_query(samples.scene())  # action set AK, AL, CK, CL, DK, DL, SK
    failure = T.FailureEvent(stamp, "AK", stamp - 0.5, ["stalled"] if collision else [], not collision)
    explanation = T.DecisionExplanation(stamp + 1.0, stamp - 0.5, stamp, query, ["AK", "CK"],
                                        "Recommended decisions: AK,CK\nExplanations:\n- AK: the road is free.")
    return failure, explanation


def _publish(failures, explanations, failure, explanation, explanation_first: bool = False) -> None:
    pair = [lambda: failures.publish(C.failure_to_msg(failure)),
            lambda: explanations.publish(C.explanation_to_msg(explanation))]
    for send in (pair[::-1] if explanation_first else pair):
        send()


def _queued(tmp_path: Path) -> list[dict]:
    """Requests put and not done in the node's outbox journal (read without opening it for writing)."""
    records = scan(tmp_path / "outbox" / "outbox.jsonl").records
    done = {r["id"] for r in records if r.get("op") == "done"}
    return [r["request"] for r in records if r.get("op") == "put" and r["request"]["id"] not in done]


def _endpoint_warning(status: DiagnosticStatus) -> bool:
    values = {kv.key: kv.value for kv in status.values}
    return status.level == DiagnosticStatus.WARN and "endpoint" in status.message and values.get("outbox") == "2"


def _attempt(status: DiagnosticStatus) -> int:
    """The retry count the endpoint warning names ("... (attempt N): ..."), 0 when none."""
    match = re.search(r"\(attempt (\d+)\)", status.message)
    return int(match.group(1)) if match else 0


@pytest.mark.slow
def test_fake_llm_endpoint_down_requests_wait_in_outbox_and_drain_when_it_returns(tmp_path, ros_context):
    bank_path, seed_ids = make_bank(tmp_path)
    port = _free_port()  # closed until the server starts below
    node = _start_client(tmp_path, bank_path, port)
    probe = Probe(ros_context)
    server = None
    try:
        results = probe.collect(lm.ReflectionResult, "luna/reflection", qos.RELIABLE)
        versions = probe.collect(UInt64, "luna/memory/version", qos.LATCHED)
        diagnostics = probe.diagnostics("reflection_client")
        failures = probe.publisher(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        explanations = probe.publisher(lm.DecisionExplanation, "luna/explanation", qos.RELIABLE)
        for p in (failures, explanations):
            wait_for_subscribers(p, timeout=120.0)
        traffic = StalledCarTraffic(probe)
        collision, stall = _events(traffic.t0 + 1.0, collision=True), _events(traffic.t0 + 1.5, collision=False)
        # Paired at once, queued only when the 6 s after each decision have been observed.
        traffic.drive(3.0, [(1.1, lambda: _publish(failures, explanations, *collision)),
                            (1.6, lambda: _publish(failures, explanations, *stall, explanation_first=True))])
        assert _queued(tmp_path) == []  # paired, but their horizons have not been observed yet
        traffic.drive(5.0)

        # Down: both requests are in the journal on disk, retried with backoff, and the node says so.
        probe.wait(lambda: len(_queued(tmp_path)) == 2, 30.0, "two requests in the outbox journal")
        assert all(r["observation"] is not None and {"stalled", "beside"} <= set(r["observation"]["objects"]["ids"])
                   for r in _queued(tmp_path))
        probe.wait(lambda: any(_endpoint_warning(s) for s in diagnostics), 30.0, "the endpoint warning")
        # Diagnostics are sampled once a second while retries run every 0.2-1 s, so "attempt 3" itself may
        # never be published: wait for any attempt number >= 3.
        probe.wait(lambda: any(_attempt(s) >= 3 for s in diagnostics), 30.0, "a third attempt")
        warning = next(s for s in diagnostics if _endpoint_warning(s))
        assert "queued in the outbox" in warning.message and "endpoint unavailable" in warning.message
        seen = len(diagnostics)
        probe.spin_for(2.5)
        assert len(diagnostics) > seen, "the node keeps publishing its diagnostics while the endpoint is down"
        assert node.poll() is None and results == []
        assert stored_version(bank_path) == len(seed_ids)

        server = FakeLLMServer(port)
        probe.wait(lambda: len(results) == 2, 60.0, "two reflection results once the endpoint is back")
        probe.wait(lambda: any(v.data == len(seed_ids) + 2 for v in versions), 30.0, "memory version +2")
        for msg in results:
            r = C.msg_to_reflection(msg)
            assert not r.error and not r.normal and r.memory_item_id
        assert sorted(C.msg_to_reflection(m).failure_stamp for m in results) == \
            pytest.approx([traffic.t0 + 1.0, traffic.t0 + 1.5])
        probe.wait(lambda: diagnostics[-1].level == DiagnosticStatus.OK, 10.0, "the endpoint condition cleared")
        assert _queued(tmp_path) == []
    finally:
        probe.close()
        output = stop_process(node, timeout=30)
        if server is not None:
            server.close()
    assert node.returncode == 0, output
    assert SECRET not in output, "the API key must never be logged"
    # What the endpoint received: Eq. 29's Q_refl (original query, explanation, failure) and the hindsight
    # outcomes, the key as a bearer token from the environment, the configured model.
    assert server is not None and len(server.requests) == 2
    assert server.auth == [f"Bearer {SECRET}"] * 2
    texts = [" ".join(m["content"] for m in r["messages"]) for r in server.requests]
    assert all(r["model"] == "fake-reasoner" for r in server.requests)
    assert any("collided with object(s) stalled" in t for t in texts)
    assert all("[Traffic state]" in t and "Recommended decisions: AK,CK" in t for t in texts)
    assert all("- CL: collides with beside" in t and "- AK: " in t for t in texts)
    assert all(a.startswith(("Recommended decisions: DK", "Recommended decisions: SK")) for a in server.answers)
    with MemoryBank.open(bank_path) as bank:
        new = [i for i in bank if i.source == "reflection"]
        assert len(bank) == len(seed_ids) + 2 and len(new) == 2
        assert sorted(i.answer for i in new) == sorted(server.answers) and all(i.distribution is None for i in new)
        assert audit_reflections(bank, tmp_path / "outbox") == (2, [])
    assert len(Outbox(tmp_path / "outbox")) == 0


@pytest.mark.slow
def test_fake_llm_requests_in_outbox_survive_a_killed_node(tmp_path, ros_context):
    bank_path, seed_ids = make_bank(tmp_path)
    port = _free_port()
    node = _start_client(tmp_path, bank_path, port)
    probe = Probe(ros_context)
    server = None
    restarted = None
    try:
        failures = probe.publisher(lm.FailureEvent, "luna/failure", qos.RELIABLE)
        explanations = probe.publisher(lm.DecisionExplanation, "luna/explanation", qos.RELIABLE)
        for p in (failures, explanations):
            wait_for_subscribers(p, timeout=120.0)
        traffic = StalledCarTraffic(probe)
        collision = _events(traffic.t0 + 1.0, collision=True)
        traffic.drive(8.0, [(1.1, lambda: _publish(failures, explanations, *collision))])
        probe.wait(lambda: len(_queued(tmp_path)) == 1, 30.0, "the request in the outbox journal")
        os.killpg(node.pid, signal.SIGKILL)  # no shutdown path runs
        node.communicate(timeout=30)

        server = FakeLLMServer(port)
        restarted = _start_client(tmp_path, bank_path, port)
        versions = probe.collect(UInt64, "luna/memory/version", qos.LATCHED)  # latched: no race with the send
        probe.wait(lambda: any(v.data == len(seed_ids) + 1 for v in versions), 120.0,
                   "the restarted node to send the queued request")
    finally:
        probe.close()
        output = stop_process(restarted, timeout=30) if restarted is not None else ""
        if server is not None:
            server.close()
    assert restarted.returncode == 0, output
    assert len(server.requests) == 1
    assert _queued(tmp_path) == []
    with MemoryBank.open(bank_path) as bank:
        assert len(bank) == len(seed_ids) + 1 and bank.items[-1].source == "reflection"


def test_a_damaged_outbox_turns_reflection_off_diagnosed_and_keeps_every_byte(tmp_path, ros_context):
    # A complete final outbox record with a flipped byte was acknowledged: the node must neither
    # truncate it nor die (the stack drives on); it runs with reflection off and says why.
    bank_path, _ = make_bank(tmp_path)
    failure, explanation = _events(100.0, collision=True)
    outbox = Outbox(tmp_path / "outbox")
    outbox.put(ReflectionRequest.from_events(explanation, failure, None, []))
    outbox.close()
    journal = tmp_path / "outbox" / "outbox.jsonl"
    data = bytearray(journal.read_bytes())
    data[-10] ^= 0x01  # inside the JSON of the last record; its newline stays
    journal.write_bytes(bytes(data))
    node = _start_client(tmp_path, bank_path, _free_port())
    probe = Probe(ros_context)
    try:
        diagnostics = probe.diagnostics("reflection_client")
        probe.wait(lambda: any(s.level == DiagnosticStatus.ERROR and "reflection off" in s.message
                               for s in diagnostics), 120.0, "the reflection-off error")
        probe.spin_for(1.0)
        assert node.poll() is None, "the node must keep running"
    finally:
        probe.close()
        output = stop_process(node, timeout=30)
    assert node.returncode == 0, output
    assert journal.read_bytes() == bytes(data)
    assert str(journal) in output and "reflection off" in output
