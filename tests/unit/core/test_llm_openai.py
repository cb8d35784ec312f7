"""OpenAI-compatible client against a local fake endpoint: a real HTTP server on 127.0.0.1 (stdlib,
threaded) speaking /v1/chat/completions, with failing, slow and rejecting modes."""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from luna_core.llm import (BudgetExceeded, CachingChatModel, EndpointConfig, LLMConfigError, LLMRequestError,
                           LLMUnavailable, OpenAIChatModel, UsageMeter)

MESSAGES = [{"role": "system", "content": "You are a driving assistant."},
            {"role": "user", "content": "Which decision?"}]


class FakeEndpoint:
    """State of the local fake endpoint: a script of per-request behaviours, and what it received."""

    def __init__(self) -> None:
        self.script: list[tuple[str, float]] = []  # ("ok" | "503" | "429" | "400" | "slow", seconds)
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.arrivals: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.delay = 0.0

    def next_mode(self) -> tuple[str, float]:
        with self.lock:
            return self.script.pop(0) if self.script else ("ok", self.delay)


def make_handler(state: FakeEndpoint):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # keep test output clean
            pass

        def _send(self, code: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            if self.path != "/v1/chat/completions":
                return self._send(404, {"error": {"message": "not found"}})
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            mode, seconds = state.next_mode()
            with state.lock:
                state.requests.append(body)
                state.headers.append({"Authorization": self.headers.get("Authorization")})
                state.arrivals.append(time.monotonic())
                state.in_flight += 1
                state.max_in_flight = max(state.max_in_flight, state.in_flight)
            time.sleep(seconds)
            # Out of flight before the answer is written: once the client has read it, it may send its next
            # request, which must not find this one still counted (seen under load, session 42).
            with state.lock:
                state.in_flight -= 1
            try:
                if mode in ("503", "429", "400"):
                    return self._send(int(mode), {"error": {"message": f"scripted {mode}"}})
                echo = {k: body.get(k) for k in ("temperature", "seed", "max_tokens", "top_k")}
                self._send(200, {
                    "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": json.dumps(echo)}}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}})
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client timed out and hung up
    return Handler


@pytest.fixture()
def endpoint():
    state = FakeEndpoint()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    yield state
    server.shutdown()
    server.server_close()


def client(state: FakeEndpoint, meter: UsageMeter | None = None, **kw) -> OpenAIChatModel:
    cfg = dict(model="fake-model", base_url=state.url, timeout=2.0, max_retries=3, backoff_base=0.01,
               backoff_max=0.05)
    cfg.update(kw)
    return OpenAIChatModel(EndpointConfig(**cfg), meter)


def test_local_fake_endpoint_chat_sends_sampling_params_and_counts_tokens(endpoint):
    meter = UsageMeter()
    c = client(endpoint, meter, price_prompt_per_1m=2.0, price_completion_per_1m=10.0)
    out = c.chat(MESSAGES, temperature=0.7, top_k=40, seed=11, max_tokens=64)
    assert json.loads(out.text) == {"temperature": 0.7, "seed": 11, "max_tokens": 64, "top_k": 40}
    assert (out.prompt_tokens, out.completion_tokens, out.finish_reason) == (100, 20, "stop")
    assert out.latency > 0.0 and out.model == "fake-model"
    assert endpoint.requests[0]["messages"] == MESSAGES
    assert meter.cost == pytest.approx((100 * 2.0 + 20 * 10.0) / 1e6)
    assert meter.summary()["models"]["fake-model"]["requests"] == 1
    no_top_k = client(endpoint, top_k_field=None)  # servers without top-k (e.g. DeepSeek)
    assert json.loads(no_top_k.chat(MESSAGES, top_k=40).text)["top_k"] is None


def test_local_fake_endpoint_retries_5xx_and_429_then_succeeds(endpoint):
    endpoint.script = [("503", 0.0), ("429", 0.0)]
    out = client(endpoint).chat(MESSAGES)
    assert json.loads(out.text)["temperature"] == 0.0
    assert len(endpoint.requests) == 3


def test_local_fake_endpoint_slow_server_times_out_then_recovers(endpoint):
    endpoint.script = [("slow", 1.5)]
    out = client(endpoint, timeout=0.3).chat(MESSAGES)
    assert out.text and len(endpoint.requests) == 2


def test_local_fake_endpoint_gives_up_after_retries(endpoint):
    endpoint.script = [("503", 0.0)] * 10
    meter = UsageMeter(spending_cap=1.0)
    with pytest.raises(LLMUnavailable, match="failed 3 attempts"):
        client(endpoint, meter, max_retries=2, price_prompt_per_1m=1.0).chat(MESSAGES)
    assert len(endpoint.requests) == 3
    assert meter.cost == 0.0 and meter._reserved == 0.0  # the reservation was released


def test_local_fake_endpoint_client_errors_are_not_retried(endpoint):
    endpoint.script = [("400", 0.0)]
    with pytest.raises(LLMRequestError, match="HTTP 400"):
        client(endpoint).chat(MESSAGES)
    assert len(endpoint.requests) == 1


def test_local_fake_endpoint_concurrency_limit(endpoint):
    endpoint.delay = 0.2
    c = client(endpoint, concurrency=2)
    with ThreadPoolExecutor(6) as pool:
        outs = list(pool.map(lambda i: c.chat(MESSAGES, seed=i), range(6)))
    assert len(outs) == 6 and endpoint.max_in_flight == 2


def test_local_fake_endpoint_rate_limit_spaces_request_starts(endpoint):
    c = client(endpoint, requests_per_minute=300.0)  # one request start every 0.2 s
    t0 = time.monotonic()
    with ThreadPoolExecutor(4) as pool:  # concurrent callers still start 0.2 s apart
        list(pool.map(lambda i: c.chat(MESSAGES, seed=i), range(4)))
    assert time.monotonic() - t0 >= 0.6 - 1e-3
    assert len(endpoint.requests) == 4


def test_local_fake_endpoint_hard_spending_cap_refuses_before_sending(endpoint):
    # Worst case of one request: ~ (chars / 2.5 + 16) prompt tokens and max_tokens completion tokens.
    meter = UsageMeter(spending_cap=0.0015)
    c = client(endpoint, meter, price_prompt_per_1m=1.0, price_completion_per_1m=1.0)
    c.chat(MESSAGES, max_tokens=1000)  # reserves ~0.00105, charged 0.00012
    with pytest.raises(BudgetExceeded, match="spending cap"):
        c.chat(MESSAGES, max_tokens=1400)  # 0.00012 + 0.00145 > cap
    assert len(endpoint.requests) == 1 and meter.cost <= 0.0015


def test_local_fake_endpoint_api_key_from_named_env_var_never_logged(endpoint, monkeypatch, caplog):
    secret = "sk-test-not-a-real-key-4f2a"
    monkeypatch.setenv("LUNA_TEST_LLM_KEY", secret)
    endpoint.script = [("503", 0.0)]
    with caplog.at_level(logging.DEBUG):
        c = client(endpoint, api_key_env="LUNA_TEST_LLM_KEY")
        c.chat(MESSAGES)
    assert endpoint.headers[-1]["Authorization"] == f"Bearer {secret}"
    assert secret not in caplog.text and secret not in repr(c) and secret not in repr(c.config)
    assert "retrying" in caplog.text
    monkeypatch.delenv("LUNA_TEST_LLM_KEY")
    with pytest.raises(LLMConfigError, match="LUNA_TEST_LLM_KEY"):
        client(endpoint, api_key_env="LUNA_TEST_LLM_KEY")


def test_local_fake_endpoint_response_cache_makes_reruns_free(endpoint, tmp_path):
    meter = UsageMeter()
    c = CachingChatModel(client(endpoint, meter, price_prompt_per_1m=1.0), tmp_path)
    first = c.chat(MESSAGES, temperature=0.7, top_k=40, seed=3, max_tokens=32)
    again = CachingChatModel(client(endpoint, meter, price_prompt_per_1m=1.0), tmp_path)  # a new process
    second = again.chat(MESSAGES, temperature=0.7, top_k=40, seed=3, max_tokens=32)
    assert second.text == first.text and second.cached and not first.cached
    assert len(endpoint.requests) == 1 and again.hits == 1
    again.chat(MESSAGES, temperature=0.7, top_k=40, seed=4, max_tokens=32)  # another seed: a new request
    assert len(endpoint.requests) == 2
    # a corrupt entry is a miss, not a crash
    for f in tmp_path.rglob("*.json"):
        f.write_text("{not json")
    third = CachingChatModel(client(endpoint, meter), tmp_path).chat(MESSAGES, temperature=0.7, top_k=40, seed=3,
                                                                      max_tokens=32)
    assert not third.cached and len(endpoint.requests) == 3
