"""On-policy distillation (issue 55): the reverse-KL advantages, GKD's generalized JSD, the teachers
(checkpoint and endpoint), and a CPU run in which the student moves toward a different teacher."""

from __future__ import annotations

import json
import math

import pytest
import torch

from reinforge.algo.distill import distill_advantages, generalized_jsd, reverse_kl_rewards
from reinforge.config import AlgoConfig, ConfigError
from reinforge.config.distill import DistillConfig
from reinforge.records import Sample, Status
from reinforge.train.rollout_advantages import compute_advantages


def test_reverse_kl_rewards_are_teacher_minus_student_on_the_students_own_tokens_only():
    teacher = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    student = torch.tensor([[-1.5, -1.0, -3.5, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last column is padding
    loss_mask = torch.tensor([[1.0, 0.0, 1.0, 1.0]])  # the second token is a tool's output
    assert reverse_kl_rewards(teacher, student, mask, loss_mask).tolist() == [[0.5, 0.0, 0.5, 0.0]]
    assert distill_advantages(teacher, student, mask, loss_mask).tolist() == [[0.5, 0.0, 0.5, 0.0]]  # discount 0


def test_a_discount_sums_the_later_student_tokens_rewards_stepping_over_tool_outputs():
    teacher = torch.tensor([[0.0, 0.0, 0.0]])
    student = torch.tensor([[-1.0, -5.0, -2.0]])  # rewards 1, (5: a tool token, not counted), 2
    adv = distill_advantages(teacher, student, torch.ones(1, 3), torch.tensor([[1.0, 0.0, 1.0]]), discount=0.5)
    assert adv.tolist() == [[1.0 + 0.5 * 2.0, 0.0, 2.0]]


def _groups(rewards, lengths):
    return [
        [
            Sample(
                prompt="p",
                tokens=[1] * (2 + n),
                response_length=n,
                reward=r,
                loss_mask=[1] * n,
                rollout_log_probs=[-1.0] * n,
                status=Status.COMPLETED,
            )
            for r, n in zip(group, lens)
        ]
        for group, lens in zip(rewards, lengths)
    ]


def test_the_distillation_advantage_is_added_to_the_task_advantage_or_replaces_it():
    groups = _groups([[1.0, 0.0]], [[2, 3]])
    teacher = [torch.tensor([-1.0, -2.0]), torch.tensor([-1.0, -1.0, -1.0])]
    student = [torch.tensor([-2.0, -2.0]), torch.tensor([-1.0, -3.0, -1.0])]
    a = AlgoConfig(advantage_estimator="rloo")
    task = compute_advantages(a, groups, 8).advantages  # rloo: +1 and -1
    d = DistillConfig(teacher_path="/teacher", kl_coef=0.5)
    mixed = compute_advantages(a, groups, 8, distill=d, teacher_log_probs=teacher, student_log_probs=student)
    assert mixed.advantages[0].tolist() == pytest.approx((task[0] + 0.5 * torch.tensor([1.0, 0.0])).tolist())
    assert mixed.advantages[1].tolist() == pytest.approx((task[1] + 0.5 * torch.tensor([0.0, 2.0, 0.0])).tolist())
    assert mixed.reverse_kl == pytest.approx((-3.0, 5.0))  # sum of log p_student - log p_teacher, tokens
    d.use_task_reward = False
    alone = compute_advantages(a, groups, 8, distill=d, teacher_log_probs=teacher, student_log_probs=student)
    assert [t.tolist() for t in alone.advantages] == [[0.5, 0.0], [0.0, 1.0, 0.0]]
    with pytest.raises(ValueError, match="teacher's and the student's log-probs"):
        compute_advantages(a, groups, 8, distill=d)


def test_a_failed_sample_gets_no_distillation_advantage():
    groups = _groups([[1.0, 0.0]], [[2, 2]])
    groups[0][1].status, groups[0][1].loss_mask = Status.FAILED, [0, 0]
    d = DistillConfig(teacher_path="/teacher", use_task_reward=False)
    lp = [torch.tensor([0.0, 0.0]), torch.tensor([0.0, 0.0])]
    out = compute_advantages(
        AlgoConfig(advantage_estimator="rloo"),
        groups,
        8,
        distill=d,
        teacher_log_probs=lp,
        student_log_probs=[torch.tensor([-1.0, -1.0])] * 2,
    )
    assert [t.tolist() for t in out.advantages] == [[1.0, 1.0], [0.0, 0.0]]


def _kl(p, q):
    return sum(a * math.log(a / b) for a, b in zip(p, q) if a > 0)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_generalized_jsd_matches_its_definition_computed_by_hand(beta):
    p_s, p_t = [0.7, 0.2, 0.1], [0.1, 0.3, 0.6]
    expected = (
        _kl(p_t, p_s)
        if beta == 0
        else _kl(p_s, p_t)
        if beta == 1
        else beta * _kl(p_t, [beta * t + (1 - beta) * s for s, t in zip(p_s, p_t)])
        + (1 - beta) * _kl(p_s, [beta * t + (1 - beta) * s for s, t in zip(p_s, p_t)])
    )
    got = generalized_jsd(torch.tensor(p_s).log()[None], torch.tensor(p_t).log()[None], beta)
    assert got.item() == pytest.approx(expected, rel=1e-5)
    # the symmetric JSD at beta 0.5 (natural log): 0.5 KL(P||M) + 0.5 KL(Q||M) of a textbook pair is ln 2
    half = generalized_jsd(torch.tensor([[0.0, -1e9]]), torch.tensor([[-1e9, 0.0]]), 0.5)
    assert half.item() == pytest.approx(math.log(2), rel=1e-5)


def test_the_distill_section_checks_its_keys():
    with pytest.raises(ConfigError, match="distill.use_task_reward=false"):
        DistillConfig(use_task_reward=False).validate()
    with pytest.raises(ConfigError, match="distill.kl_coef"):
        DistillConfig(teacher_path="/t", kl_coef=0).validate()
    d = DistillConfig(teacher_path="/local", teachers={"code": "http://h:8000/v1"})
    assert d.local_teachers() == {"": "/local"} and d.endpoint_teachers() == {"code": "http://h:8000/v1"}


def test_a_row_naming_an_unknown_teacher_is_refused_in_words():
    from reinforge.distill.teachers import check_teacher_names

    d = DistillConfig(teachers={"math": "/m"})
    check_teacher_names([{"teacher": "math"}], d)
    with pytest.raises(ConfigError, match="metadata.teacher='code' is not a key of distill.teachers"):
        check_teacher_names([{"teacher": "math"}, {"teacher": "code"}], d)
    with pytest.raises(ConfigError, match="names no teacher"):
        check_teacher_names([{}], d)


# ------------------------------------------------------------------------------ endpoint teachers


class StubTeacher:
    """A local HTTP server speaking vLLM's OpenAI completions API with ``prompt_logprobs`` (or SGLang's
    ``/generate`` with ``return_logprob``): the log-prob of the token at position j is ``-0.01 * (j + tok % 7)``.
    ``mode``: ``ok``, ``no_logprobs`` (an endpoint that ignores prompt_logprobs), ``other_tokenizer`` (decodes ids
    differently), ``down`` (HTTP 503 on every request)."""

    def __init__(self, tokenizer, mode="ok"):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stub = self
        self.tokenizer, self.mode, self.requests = tokenizer, mode, []

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _send(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send(200, {"data": [{"id": "stub-teacher"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((self.path, body))
                if stub.mode == "down":
                    return self._send(503, {"error": "overloaded"})
                if self.path.endswith("/generate"):
                    return self._send(200, [stub.sglang(ids) for ids in body["input_ids"]])
                return self._send(200, {"choices": [stub.vllm(i, ids) for i, ids in enumerate(body["prompt"])]})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def logprob(j, tok):
        return -0.01 * (j + tok % 7)

    def vllm(self, index, ids):
        if self.mode == "no_logprobs":
            return {"index": index, "text": "x", "prompt_logprobs": None}
        decode = (lambda t: "zz") if self.mode == "other_tokenizer" else (lambda t: self.tokenizer.decode([t]))
        entries = [None] + [
            {str(t): {"logprob": self.logprob(j, t), "rank": 1, "decoded_token": decode(t)}}
            for j, t in enumerate(ids)
            if j > 0
        ]
        return {"index": index, "text": "x", "prompt_logprobs": entries}

    def sglang(self, ids):
        entries = [[None, ids[0], "x"]] + [[self.logprob(j, t), t, "x"] for j, t in enumerate(ids) if j > 0]
        return {"text": "", "meta_info": {"input_token_logprobs": entries}}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tok(smollm2_tokenizer_path):
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(smollm2_tokenizer_path)


def _sample(tokens, response_length, teacher=None):
    return Sample(
        prompt="p",
        tokens=tokens,
        response_length=response_length,
        loss_mask=[1] * response_length,
        rollout_log_probs=[-1.0] * response_length,
        metadata={"teacher": teacher} if teacher else {},
        status=Status.COMPLETED,
    )


@pytest.mark.parametrize("api", ["vllm", "sglang"])
def test_an_endpoint_teacher_scores_the_response_tokens_in_batches(tok, api):
    from reinforge.distill.endpoint import EndpointTeachers
    from reinforge.distill.teachers import TEACHER_LOG_PROBS

    stub = StubTeacher(tok)
    try:
        url = stub.url if api == "vllm" else stub.url.removesuffix("/v1")
        d = DistillConfig(teacher_path=url, teacher_api=api, batch_size=2, retries=0)
        teachers = EndpointTeachers(d, tok)
        groups = [[_sample([5, 6, 7, 8, 9], 2), _sample([5, 6, 10], 1)], [_sample([3, 4, 11, 12], 3)]]
        metrics = teachers.score(groups)
    finally:
        stub.close()
    assert metrics["distill/teacher_failed_samples"] == 0
    got = [s.metadata[TEACHER_LOG_PROBS] for g in groups for s in g]
    assert got[0] == pytest.approx([StubTeacher.logprob(3, 8), StubTeacher.logprob(4, 9)])
    assert got[1] == pytest.approx([StubTeacher.logprob(2, 10)])
    assert got[2] == pytest.approx([StubTeacher.logprob(j, t) for j, t in ((1, 4), (2, 11), (3, 12))])
    scoring = [b for path, b in stub.requests[1:] if path.endswith(("/completions", "/generate"))]
    if api == "vllm":  # (after the start-up probe and the tokenizer check) two batches: 2 samples and 1 (concurrent)
        assert sorted(len(b["prompt"]) for b in scoring[-2:]) == [1, 2] and scoring[-1]["prompt_logprobs"] == 0
        assert scoring[-1]["model"] == "stub-teacher"


def test_an_endpoint_without_prompt_logprobs_or_with_another_tokenizer_is_refused_at_start(tok):
    from reinforge.distill.endpoint import EndpointTeachers, TeacherEndpointError

    for mode, words in (("no_logprobs", "returned no prompt_logprobs"), ("other_tokenizer", "tokenizer differs")):
        stub = StubTeacher(tok, mode)
        try:
            with pytest.raises(TeacherEndpointError, match=words):
                EndpointTeachers(DistillConfig(teacher_path=stub.url, retries=0), tok)
        finally:
            stub.close()


def test_a_failing_endpoint_marks_its_samples_failed_and_counts_them(tok):
    from reinforge.distill.endpoint import EndpointTeachers
    from reinforge.rollout.infra_guard import InfraGuard

    stub = StubTeacher(tok)
    try:
        teachers = EndpointTeachers(DistillConfig(teacher_path=stub.url, retries=1, timeout=5), tok)
        stub.mode = "down"
        groups = [[_sample([5, 6, 7], 1), _sample([5, 6, 8], 1)]]
        metrics = teachers.score(groups)
    finally:
        stub.close()
    assert metrics["distill/teacher_failed_samples"] == 2
    flat = groups[0]
    assert all(s.status == Status.FAILED and s.loss_mask == [0] for s in flat)
    assert "HTTP 503" in flat[0].metadata["infra_failure"] and flat[0].metadata["infra_failure_kind"] == "teacher"
    assert InfraGuard().observe(0, flat)["rollout/infra_failed/teacher"] == 2
    assert len(stub.requests) >= 2 + 2  # start-up probe + check, then the batch tried twice (one retry)


def test_a_checkpoint_teacher_with_another_tokenizer_is_refused_in_words(tmp_path, tok, smollm2_tokenizer_path):
    import shutil

    from reinforge.distill.teachers import check_tokenizers

    other = tmp_path / "other"
    other.mkdir()
    for f in smollm2_tokenizer_path.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "config.json"):
            shutil.copy2(f, other / f.name)
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids
    (other / "tokenizer.json").write_text(json.dumps(spec))
    check_tokenizers(DistillConfig(teacher_path=str(smollm2_tokenizer_path)), tok, "student")
    with pytest.raises(ConfigError, match="distill.teacher_path=.*tokenizer differs from the student's"):
        check_tokenizers(DistillConfig(teacher_path=str(other)), tok, "student")


def test_the_planner_counts_a_checkpoint_teachers_memory_and_time(smollm2_path):
    from reinforge.config import load_config
    from reinforge.plan import GPUS
    from reinforge.plan import model as M
    from reinforge.plan.planner import read_arch, workload

    arch, _ = read_arch(smollm2_path)
    plain = workload(load_config(None, [f"model.path={smollm2_path}"]), arch, GPUS["h100"], 128)
    cfg = load_config(None, [f"model.path={smollm2_path}", f"distill.teacher_path={smollm2_path}"])
    w = workload(cfg, arch, GPUS["h100"], 128)
    assert w.teacher_params == arch.num_params and plain.teacher_params == 0
    assert M.trainer_resident(w)["teachers"] == 2 * arch.num_params  # bf16 on one rank, as the reference
    assert "teachers" not in M.trainer_resident(plain)
    assert M.logprob_seconds(w) > M.logprob_seconds(plain)
    assert "teachers" in next(b for b in M.memory_plan(w) if b.phase == "log-probs").parts


def test_make_data_kd_writes_the_teachers_finished_completions_as_sft_chats(tmp_path, tiny_model_path):
    from reinforge.cli import main

    out = tmp_path / "kd.jsonl"
    args = [
        f"model.path={tiny_model_path}",
        "data.prompt_data=reasoning_gym:basic_arithmetic",
        "data.num_prompts=8",
        "rollout.n_samples_per_prompt=2",
        "rollout.rollout_max_response_len=12",
        "rollout.rollout_stop=[e, a, o, i, ' ']",  # (a random model's completions end early)
    ]
    assert main(["make-data", "kd", "--out", str(out), "--num-prompts", "4", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert 0 < len(rows) <= 8
    for r in rows:
        assert set(r) == {"messages"} and r["messages"][0]["role"] == "user"
        assert r["messages"][-1]["role"] == "assistant" and isinstance(r["messages"][-1]["content"], str)


# ------------------------------------------------------------------------------ a run on the CPU


def _scaled_copy(src, out, scale):
    """A copy of the model at ``src`` whose final norm's weight is multiplied by ``scale``: its logits are
    ``scale`` times the original's (0: every logit 0, the uniform distribution over its vocabulary)."""
    import shutil

    from safetensors.torch import load_file, save_file

    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy2(f, out / f.name)
    for f in src.glob("*.safetensors"):
        state = load_file(f)
        state["model.norm.weight"] = state["model.norm.weight"] * scale
        save_file(state, out / f.name, metadata={"format": "pt"})
    return out


@pytest.mark.parametrize("teacher", ["student", "uniform"])
def test_opd_through_the_cli_scores_the_students_samples_with_the_teacher(tmp_path, tiny_model_path, teacher):
    """OPD alone (no task reward) through the CLI on a tiny model whose logits are doubled (a peaked
    student). A teacher identical to the student gives reverse KL 0 (its pass is aligned with the engine's
    log-probs token by token); a uniform teacher (logits zeroed) gives ``log V - H(student)`` on the
    student's own samples, and that advantage reaches the policy loss unchanged (``pg_loss`` at ratio 1 is
    minus the mean advantage). The teacher's pass is timed."""
    from reinforge.cli import main
    from tests.integration.test_integration import read_metrics, tiny_overrides

    student = _scaled_copy(tiny_model_path, tmp_path / "student", 2.0)
    teacher_path = student if teacher == "student" else _scaled_copy(tiny_model_path, tmp_path / "teacher", 0.0)
    out = tmp_path / "run"
    overrides = tiny_overrides(
        student,
        out,
        **{
            "distill.teacher_path": teacher_path,
            "distill.use_task_reward": "false",
            "rollout.n_samples_per_prompt": 2,
            "rollout.rollout_max_response_len": 8,
            "rollout.rollout_batch_size": 4,
            "train.num_rollout": 1,
            "data.n_eval_prompts": 0,
            "run.save_final": "false",
        },
    )
    assert main(["train", *overrides]) == 0
    (m,) = [m for m in read_metrics(out) if "distill/reverse_kl" in m]
    assert m["distill/teacher_seconds"] > 0
    if teacher == "student":
        assert abs(m["distill/reverse_kl"]) < 1e-4 and abs(m["rollout/advantage_mean"]) < 1e-4
        return
    expected = math.log(49152) - m["train/entropy"]  # E_student[log s - log(1/V)] = log V - H(s)
    assert m["distill/reverse_kl"] == pytest.approx(expected, rel=0.2)
    assert m["train/pg_loss"] == pytest.approx(m["distill/reverse_kl"], rel=1e-4)
    assert m["rollout/advantage_mean"] == pytest.approx(-m["distill/reverse_kl"], rel=1e-4)


def test_each_sample_goes_to_the_teacher_its_row_names():
    from reinforge.distill.teachers import TEACHER_LOG_PROBS, rank_teacher_log_probs

    class Actor:  # records which checkpoint teacher scored which samples
        teachers = {"": object(), "math": object()}
        calls: list = []

        def compute_log_probs(self, samples, owned, teacher):
            self.calls.append((teacher, list(owned)))
            out = [None] * len(samples)
            for i in owned:
                out[i] = torch.full((samples[i].response_length,), -1.0 if teacher == "math" else -2.0)
            return out

    samples = [_sample([1, 2, 3], 1, "math"), _sample([1, 2, 3], 1), _sample([1, 2, 3, 4], 2, "code")]
    samples[2].metadata[TEACHER_LOG_PROBS] = [-3.0, -4.0]  # scored by the endpoint teacher "code" already
    d = DistillConfig(teacher_path="/base", teachers={"math": "/math", "code": "http://h:1/v1"})
    actor = Actor()
    got = rank_teacher_log_probs(actor, samples, [0, 1, 2], d)
    assert [g.tolist() for g in got] == [[-1.0], [-2.0], [-3.0, -4.0]]
    assert actor.calls == [("", [1]), ("math", [0])]  # every checkpoint teacher runs, in one order on every rank
    assert rank_teacher_log_probs(actor, samples, [], d) == [] and actor.calls[-2:] == [("", []), ("math", [])]
    samples[2].metadata.pop(TEACHER_LOG_PROBS)
    with pytest.raises(RuntimeError, match="is an endpoint but the sample carries no log-probs"):
        rank_teacher_log_probs(actor, samples, [2], d)


def test_an_endpoint_teacher_through_the_cli(tmp_path, tiny_model_path, tok):
    """The loop scores each rollout with the endpoint before the trainer ranks see it; an endpoint that is
    down at start is refused in one line (exit status 2)."""
    from reinforge.cli import main
    from tests.integration.test_integration import read_metrics, tiny_overrides

    stub = StubTeacher(tok)
    try:
        extra = {
            "distill.teacher_path": stub.url,
            "distill.retries": 0,
            "rollout.n_samples_per_prompt": 2,
            "rollout.rollout_max_response_len": 6,
            "train.num_rollout": 1,
            "data.n_eval_prompts": 0,
            "run.save_final": "false",
        }
        assert main(["train", *tiny_overrides(tiny_model_path, tmp_path / "run", **extra)]) == 0
        (m,) = [m for m in read_metrics(tmp_path / "run") if "distill/reverse_kl" in m]
        assert m["distill/teacher_failed_samples"] == 0 and m["distill/teacher_endpoint_seconds"] > 0
        assert math.isfinite(m["distill/reverse_kl"]) and "distill/teacher_seconds" in m
        stub.mode = "down"
        assert main(["train", *tiny_overrides(tiny_model_path, tmp_path / "run2", **extra)]) == 2
    finally:
        stub.close()


# ------------------------------------------------------------------------------ GKD on the offline trainer


def test_gkd_matches_the_teacher_offline_and_is_zero_against_itself(tmp_path, tiny_model_path):
    """``offline.method=gkd``: the student (the tiny model) trained toward a teacher (the same model with its
    logits doubled) on SFT data lowers the generalized JSD on held-out chats; against itself it is 0."""
    from reinforge.config import load_config
    from reinforge.offline_loop import run_offline
    from tests.integration.test_offline import offline_overrides, write_data

    files = write_data(tmp_path, n=12)
    teacher = _scaled_copy(tiny_model_path, tmp_path / "teacher", 2.0)
    common = {
        "offline.eval_data": files["sft"],
        "eval.eval_before_train": "true",
        "offline.global_batch_size": 4,
        "offline.num_epochs": 3,
        "train.lr": 1e-3,
    }
    evals = run_offline(
        load_config(
            None,
            offline_overrides(
                tiny_model_path, tmp_path / "gkd", files["sft"], "gkd", **common, **{"distill.teacher_path": teacher}
            ),
        )
    )
    first, last = evals[0][1], evals[-1][1]
    assert first["eval/jsd"] > 0 and last["eval/jsd"] < 0.9 * first["eval/jsd"], evals
    assert first["eval/loss"] == pytest.approx(first["eval/jsd"], rel=1e-4)  # the loss is the token-mean JSD
    itself = run_offline(
        load_config(
            None,
            offline_overrides(
                tiny_model_path,
                tmp_path / "self",
                files["sft"],
                "gkd",
                **{**common, "offline.num_epochs": 1, "distill.teacher_path": tiny_model_path},
            ),
        )
    )
    assert itself[0][1]["eval/jsd"] == pytest.approx(0.0, abs=1e-5)


def test_gkd_needs_a_checkpoint_teacher(tmp_path, tiny_model_path):
    from reinforge.config import load_config
    from reinforge.distill.teachers import gkd_teacher_path

    cfg = load_config(None, [f"model.path={tiny_model_path}", "offline.method=gkd"])
    with pytest.raises(ConfigError, match="offline.method=gkd needs a checkpoint teacher in distill.teacher_path"):
        gkd_teacher_path(cfg)
    cfg.distill.teacher_path = "http://h:8000/v1"
    with pytest.raises(ConfigError, match="an endpoint does not return"):
        gkd_teacher_path(cfg)


def test_gkd_lmbda_trains_on_the_students_own_samples(tmp_path, tiny_model_path, monkeypatch):
    """``offline.gkd_lmbda`` (TRL ``GKDConfig.lmbda``): 1 replaces every step's responses with the student's own
    samples for the same prompts (drawn token by token from the student at ``gkd_temperature``: the same tokens an
    independent sampler over the Hugging Face model draws with the same generator), 0 uses only the dataset's."""
    from transformers import AutoModelForCausalLM

    import reinforge.offline_loop as loop_module
    from reinforge.config import load_config
    from reinforge.offline_loop import run_offline
    from tests.integration.test_integration import read_metrics
    from tests.integration.test_offline import offline_overrides, write_data

    files = write_data(tmp_path, n=8)
    teacher = _scaled_copy(tiny_model_path, tmp_path / "teacher", 2.0)
    seen = []
    real = loop_module.student_examples

    def spy(trainer, examples, ids, max_new, temperature, stops, seed):
        if not seen:  # the first step: the student is still the initial model, sample it independently
            hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
            gen, prompts = torch.Generator().manual_seed(seed), [examples[i].prompt_ids for i in ids]
            want, active = [[] for _ in ids], list(range(len(ids)))
            with torch.no_grad():
                for _ in range(max_new):
                    if not active:
                        break
                    logits = torch.stack([hf(torch.tensor([prompts[i] + want[i]])).logits[0, -1] for i in active])
                    drawn = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
                    for i, t in zip(active, drawn.tolist()):
                        want[i].append(t)
                    active = [i for i in active if want[i][-1] not in stops]
            seen.append(want)
        out = real(trainer, examples, ids, max_new, temperature, stops, seed)
        seen.append((ids, [examples[i] for i in ids], out))
        return out

    monkeypatch.setattr(loop_module, "student_examples", spy)
    common = {"offline.global_batch_size": 4, "offline.gkd_max_new_tokens": 5, "distill.teacher_path": teacher}
    cfg = offline_overrides(tiny_model_path, tmp_path / "on", files["sft"], "gkd", **common, **{"offline.gkd_lmbda": 1})
    run_offline(load_config(None, cfg))
    rows = [m for m in read_metrics(tmp_path / "on") if "train/on_policy" in m]
    assert len(rows) == 2 and all(m["train/on_policy"] == 1.0 for m in rows)
    want, steps = seen[0], seen[1:]
    assert len(steps) == 2
    for ids, given, got in steps:
        assert [e.prompt_ids for e in got] == [e.prompt_ids for e in given]  # the same prompts
        assert all(1 <= len(e.responses[0]) <= 5 and e.loss_masks == [[1] * len(e.responses[0])] for e in got)
        assert all(e.responses[0] != g.responses[0] for e, g in zip(got, given))  # not the dataset's answers
    assert [e.responses[0] for e in steps[0][2]] == want  # the student's own samples
    seen.clear()
    cfg = offline_overrides(
        tiny_model_path, tmp_path / "off", files["sft"], "gkd", **common, **{"offline.gkd_lmbda": 0}
    )
    run_offline(load_config(None, cfg))
    assert seen == [] and all(
        m["train/on_policy"] == 0.0 for m in read_metrics(tmp_path / "off") if "train/on_policy" in m
    )


def test_gkd_lmbda_draws_its_share_of_steps_and_is_for_gkd_only():
    from reinforge.config import ConfigError, load_config
    from reinforge.train.on_policy import is_on_policy_step

    assert all(is_on_policy_step(1.0, 3, i) for i in range(200))
    assert not any(is_on_policy_step(0.0, 3, i) for i in range(200))
    draws = [is_on_policy_step(0.3, 3, i) for i in range(2000)]
    assert 0.25 < sum(draws) / 2000 < 0.35 and draws == [is_on_policy_step(0.3, 3, i) for i in range(2000)]
    with pytest.raises(ConfigError, match="offline.gkd_lmbda=0.5 applies to offline.method=gkd only"):
        load_config(None, ["offline.method=sft", "offline.gkd_lmbda=0.5"])


def test_gkd_lmbda_on_two_ranks_equals_one_process(tmp_path, tiny_model_path):
    """The student's samples under FSDP: every rank samples every prompt alike and the ranks agree on when the
    samples end, so two ranks train on the same samples as one process (same losses and weights)."""
    from tests.integration.test_offline import EQ, assert_two_ranks_equal_one, write_data

    files = write_data(tmp_path, n=7)
    teacher = _scaled_copy(tiny_model_path, tmp_path / "teacher", 2.0)
    extra = {**EQ, "distill.teacher_path": teacher, "offline.gkd_lmbda": 1, "offline.gkd_max_new_tokens": 4}
    assert_two_ranks_equal_one(tmp_path, tiny_model_path, files["sft"], "gkd", **extra)
