"""reward.type=judge: an LLM judge at an OpenAI-compatible endpoint (a tiny server on loopback)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reinforge.config import JudgeConfig, RewardConfig, load_config
from reinforge.config.fields import ConfigError
from reinforge.records import Sample, Status
from reinforge.reward.judge import JudgeFailure, JudgeReward
from reinforge.reward.manager import RewardManager


class Judge:
    """A fake judge: answers each request with ``reply(prompt)`` after ``delay`` seconds (HTTP ``status``)."""

    def __init__(self, reply=lambda prompt: "Looks right.\n8", delay: float = 0.0, status: int = 200):
        self.reply, self.delay, self.status = reply, delay, status
        self.bodies: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.bodies.append({"path": self.path, **body})
                time.sleep(judge.delay)
                out = json.dumps(
                    {
                        "choices": [
                            {"message": {"role": "assistant", "content": judge.reply(body["messages"][-1]["content"])}}
                        ]
                    }
                )
                try:
                    self.send_response(judge.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(out)))
                    self.end_headers()
                    self.wfile.write(out.encode())
                except OSError:  # the client gave up (timeout)
                    pass

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def judge():
    j = Judge()
    yield j
    j.close()


def _sample(response="4", label="4", prompt="What is 2 + 2?", i=0):
    return Sample(
        prompt=prompt, tokens=[1, 2, 3], response_length=2, response=response, label=label, index=i, loss_mask=[1, 1]
    )


def _mgr(url, timeout=10.0, **kw):
    """A judge reward's manager: ``kw`` are keys of the ``judge`` section."""
    return RewardManager(RewardConfig(type="judge", timeout=timeout), judge=JudgeConfig(url=url, model="judge-m", **kw))


def test_score_parsed_and_normalised(judge):
    s = [_sample(), _sample(response="5", i=1)]
    judge.reply = lambda p: "The answer is wrong.\nScore: 2" if "\n5\n" in p else "Correct.\n8"
    counts = _mgr(judge.url).score(s)
    assert [x.reward for x in s] == [0.8, 0.2]
    assert counts["reward/errors"] == 0 and counts["reward/judge_unparseable"] == 0
    assert all(x.status != Status.FAILED for x in s)
    b = judge.bodies[0]
    assert b["path"] == "/v1/chat/completions" and b["model"] == "judge-m" and b["temperature"] == 0


def test_template_gets_question_response_label(judge):
    s = [
        _sample(
            response="four",
            label="4",
            prompt=[{"role": "system", "content": "sys"}, {"role": "user", "content": "What is 2 + 2?"}],
        )
    ]
    _mgr(judge.url, template="Q={question} R={response} L={label} {braces}").score(s)
    assert judge.bodies[0]["messages"][-1]["content"] == "Q=What is 2 + 2? R=four L=4 {braces}"


def test_score_regex_and_max_score(judge):
    judge.reply = lambda p: "VERDICT: 1 of 1 (checked 3 steps)"
    s = [_sample()]
    _mgr(judge.url, score_regex=r"VERDICT: (\d+)", max_score=1).score(s)
    assert s[0].reward == 1.0


def test_unparseable_is_counted_and_left_out(judge):
    s = [_sample(response="nonsense"), _sample(i=1), _sample(response="12", i=2)]
    judge.reply = lambda p: {"nonsense": "I cannot decide.", "12": "42"}.get(
        p.split("Response:\n")[1].split("\n")[0], "10"
    )
    counts = _mgr(judge.url).score(s)
    assert counts["reward/judge_unparseable"] == 2 and counts["reward/errors"] == 2
    assert counts["reward/judge_errors"] == 0
    assert s[1].reward == 1.0 and s[1].status != Status.FAILED
    for x in (s[0], s[2]):  # out of range (42 > 10) is unparseable too
        assert x.status == Status.FAILED and x.loss_mask == [0, 0] and "judge" in x.metadata["infra_failure"]


def test_timeout_is_retried_then_counted():
    j = Judge(delay=1.5)
    try:
        s = [_sample()]
        t0 = time.monotonic()
        counts = _mgr(j.url, timeout=0.3, retries=1).score(s)
        assert time.monotonic() - t0 < 4
        assert len(j.bodies) == 2  # the first try and one retry
        assert counts["reward/judge_errors"] == 1 and counts["reward/errors"] == 1
        assert s[0].status == Status.FAILED and "failed 2 times" in s[0].reward_info["reward_failure"]
    finally:
        j.close()


def test_unreachable_judge_is_an_error_not_a_zero():
    mgr = _mgr("http://127.0.0.1:9/v1", timeout=0.5, retries=0)
    s = [_sample()]
    counts = mgr.score(s)
    assert counts["reward/judge_errors"] == 1 and s[0].status == Status.FAILED


def test_cache_avoids_a_second_request(judge):
    mgr = _mgr(judge.url)
    a, b = [_sample()], [_sample(i=5)]
    mgr.score(a)
    mgr.score(b)
    assert len(judge.bodies) == 1 and a[0].reward == b[0].reward == 0.8
    mgr.score([_sample(label="5")])  # another label: judged again
    assert len(judge.bodies) == 2


def test_cache_is_bounded(judge):
    jr = JudgeReward(judge.url, "m", cache_size=2)
    for r in ("1", "2", "3"):
        jr(_sample(response=r))
    assert len(jr._cache) == 2 and jr.requests == 3


def test_parse():
    jr = JudgeReward("http://127.0.0.1:1/v1", "m")
    assert jr.parse("first 3, then finally 7.5") == 0.75
    with pytest.raises(JudgeFailure) as e:
        jr.parse("no digits")
    assert e.value.kind == "judge_unparseable"


def test_config_needs_url_and_model():
    with pytest.raises(ConfigError, match="needs judge.url"):
        load_config(None, ["reward.type=judge"])
    load_config(None, ["reward.type=judge", "judge.url=http://127.0.0.1:8000/v1", "judge.model=m"])


def test_a_verdict_word_is_scored_by_judge_verdicts(judge):
    judge.reply = lambda p: "The response matches.\nVerdict: Yes" if "Response:\n4\n" in p else "No, it does not match."
    s = [_sample(), _sample(response="5", i=1)]
    kw = dict(score_regex=r"(?i)\b(yes|no)\b", max_score=1, verdicts={"yes": 1, "no": 0})
    counts = _mgr(judge.url, **kw).score(s)
    assert [x.reward for x in s] == [1.0, 0.0] and counts["reward/judge_unparseable"] == 0
    jr = JudgeReward("http://127.0.0.1:1/v1", "m", score_regex=r"(\w+)$", max_score=1, verdicts={"yes": 1})
    with pytest.raises(JudgeFailure, match=r"'maybe' is not a number nor a verdict of judge.verdicts \['yes'\]"):
        jr.parse("maybe")


def test_config_refuses_verdicts_out_of_range():
    for verdicts in ({"yes": 2.0}, {"yes": "1"}, {True: 1}):
        with pytest.raises(ConfigError, match="judge.verdicts"):
            JudgeConfig(url="http://x/v1", model="m", max_score=1, verdicts=verdicts).validate()

    with pytest.raises(ConfigError, match="quote them"):  # YAML 1.1: unquoted yes / no are booleans
        load_config(None, ["reward.type=judge", "judge.model_path=x", "judge.verdicts={yes: 1, no: 0}"])
    cfg = load_config(None, ["reward.type=judge", "judge.model_path=x", "judge.verdicts={'yes': 1}"])
    assert cfg.judge.verdicts == {"yes": 1}


# ---------------------------------------------------------------------- the start-up check (issue 57)


def test_the_judge_endpoint_is_checked_at_start(judge, caplog):
    import logging

    from reinforge.reward.judge import check_endpoint

    cfg = JudgeConfig(url=judge.url, model="judge-m")
    with caplog.at_level(logging.INFO, logger="reinforge.reward.judge"):
        assert check_endpoint(cfg, timeout=10.0) >= 0
    (body,) = judge.bodies
    assert body["path"] == "/v1/chat/completions" and body["model"] == "judge-m" and body["max_tokens"] == 1
    assert f"the judge answers at judge.url={judge.url} (judge.model='judge-m')" in caplog.text


def test_a_judge_that_refuses_the_model_name_is_a_usage_error():
    from reinforge.reward.judge import check_endpoint

    j = Judge(status=404)
    try:
        cfg = JudgeConfig(url=j.url, model="no-such-model")
        with pytest.raises(ValueError, match=r"judge.model='no-such-model'.*HTTP 404.*Set judge.model"):
            check_endpoint(cfg, timeout=10.0)
    finally:
        j.close()


def test_a_judge_that_is_down_stops_the_run_before_the_policy_is_built(tmp_path, tiny_model_path, monkeypatch, capsys):
    """Before: the run built the model and generated a rollout, then every sample's judge failed.
    Now: ``reinforge train`` says so in one line and exits 1 before anything is built."""
    import reinforge.loop
    from reinforge import cli
    from tests.integration.test_integration import tiny_overrides

    def built(*a, **k):
        raise AssertionError("the policy was built before the judge was checked")

    monkeypatch.setattr(reinforge.loop, "build_cluster", built)
    overrides = tiny_overrides(
        tiny_model_path,
        tmp_path / "run",
        **{
            "reward.type": "judge",
            "judge.url": "http://127.0.0.1:9/v1",
            "judge.model": "judge-m",
            "reward.timeout": 0.5,
            "judge.retries": 0,
        },
    )
    assert cli.main(["train", *overrides]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("reinforge train: error: judge.url=http://127.0.0.1:9/v1")
    assert "the judge does not answer (1 try of reward.timeout=0.5 s; last: ConnectionError" in err[0]


def test_a_judge_timeout_is_a_judge_error_left_out_not_a_scored_zero(caplog):
    """The manager's own bound on a judge call (every try, :meth:`JudgeReward.budget`) running out counts
    in reward/judge_errors (not reward/timeouts, which is a reward function's), and the log says the
    sample is left out, not "scored 0"."""
    import logging

    j = Judge(delay=1.5)
    try:
        mgr = _mgr(j.url, timeout=5.0, retries=0)
        mgr.judge.budget = lambda: 0.3
        s = [_sample()]
        with caplog.at_level(logging.WARNING, logger="reinforge.reward.manager"):
            counts = mgr.score(s)
        assert counts["reward/judge_errors"] == 1 and counts["reward/errors"] == 1 and counts["reward/timeouts"] == 0
        assert s[0].status == Status.FAILED and s[0].metadata["infra_failure_kind"] == "judge"
        assert "(left out of training: the judge's failure, not the model's score;" in caplog.text
        assert "scored 0" not in caplog.text
    finally:
        j.close()
