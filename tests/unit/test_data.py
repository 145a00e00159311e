"""Prompt sources, tokenization, dropping of long prompts and resumable iteration."""

import json

import pytest

from reinforge.data import DataError, PromptDataset, load_jsonl, load_source


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    from reinforge.models.loading import load_tokenizer

    return load_tokenizer(smollm2_path)


def test_jsonl_slime_format(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(
        json.dumps({"prompt": "What is 1+1?", "label": "2", "metadata": {"k": 1}})
        + "\n\n"
        + json.dumps({"prompt": [{"role": "user", "content": "hi"}], "label": 3})
        + "\n"
    )
    recs = load_jsonl(p)
    assert [r.label for r in recs] == ["2", 3]
    assert recs[0].metadata == {"k": 1} and recs[1].metadata == {}


def test_jsonl_custom_keys(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"question": "q", "answer": "a", "info": {"x": 1}}) + "\n")
    (r,) = load_jsonl(p, input_key="question", label_key="answer", metadata_key="info")
    assert (r.prompt, r.label, r.metadata) == ("q", "a", {"x": 1})


@pytest.mark.parametrize(
    "line,match",
    [
        ("{not json", "d.jsonl:2: not valid JSON"),
        ("[1, 2]", "d.jsonl:2: expected a JSON object"),
        ('{"label": 1}', "d.jsonl:2: no 'prompt' key"),
        ('{"prompt": [{"role": "user"}]}', r"d.jsonl:2: 'prompt'\[0\] must be a message"),
        ('{"prompt": ""}', "d.jsonl:2: 'prompt' is empty"),
        ('{"prompt": "x", "metadata": 5}', "d.jsonl:2: 'metadata' must be an object"),
    ],
)
def test_jsonl_bad_lines_name_file_and_line(tmp_path, line, match):
    p = tmp_path / "d.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(DataError, match=match):
        load_jsonl(p)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_jsonl(tmp_path / "nope.jsonl")


def test_reasoning_gym_source_is_seeded():
    a = load_source("reasoning_gym:basic_arithmetic", size=5, seed=3, task_kwargs={"min_terms": 2, "max_terms": 2})
    b = load_source("reasoning_gym:basic_arithmetic", size=5, seed=3, task_kwargs={"min_terms": 2, "max_terms": 2})
    c = load_source("reasoning_gym:basic_arithmetic", size=5, seed=4, task_kwargs={"min_terms": 2, "max_terms": 2})
    assert [r.prompt for r in a] == [r.prompt for r in b] != [r.prompt for r in c]
    entry = a[0].metadata["reasoning_gym"]["entry"]
    assert entry["answer"] == a[0].label and a[0].metadata["reasoning_gym"]["task"] == "basic_arithmetic"
    json.dumps(a[0].metadata)  # serialisable


def test_reasoning_gym_errors():
    with pytest.raises(DataError, match="unknown reasoning-gym task 'basic_arithmetc'.*basic_arithmetic"):
        load_source("reasoning_gym:basic_arithmetc", size=2, seed=0)
    with pytest.raises(DataError, match="task_kwargs"):
        load_source("reasoning_gym:basic_arithmetic", size=2, seed=0, task_kwargs={"min_terms": 5, "max_terms": 2})


def test_dataset_chat_template_and_drop(tokenizer):
    recs = load_source("reasoning_gym:basic_arithmetic", size=20, seed=0)
    ds = PromptDataset(recs, tokenizer, system_prompt="Be brief.", max_prompt_len=10_000)
    p = ds.prompts[0]
    assert "<|im_start|>system\nBe brief.<|im_end|>" in p.text and p.text.endswith("<|im_start|>assistant\n")
    assert tokenizer.decode(p.prompt_ids) == p.text
    lengths = sorted(len(p.prompt_ids) for p in ds.prompts)
    cut = lengths[len(lengths) // 2]
    ds2 = PromptDataset(recs, tokenizer, system_prompt="Be brief.", max_prompt_len=cut)
    assert ds2.num_dropped == sum(n > cut for n in lengths) > 0
    assert len(ds2) == 20 - ds2.num_dropped
    with pytest.raises(ValueError, match="rollout_max_prompt_len"):
        PromptDataset(recs, tokenizer, max_prompt_len=1)


def test_dataset_iteration_resumes_exactly(tokenizer):
    recs = load_source("reasoning_gym:basic_arithmetic", size=7, seed=0)
    a = PromptDataset(recs, tokenizer, seed=1)
    first = [p.index for p in a.next_batch(5)]
    state = a.state_dict()
    rest = [p.index for p in a.next_batch(6)]  # crosses into epoch 1
    assert sorted(first + rest[:2]) == list(range(7))
    b = PromptDataset(recs, tokenizer, seed=1)
    b.load_state_dict(state)
    assert [p.index for p in b.next_batch(6)] == rest
    with pytest.raises(ValueError, match="same data settings"):
        PromptDataset(recs[:5], tokenizer, seed=1).load_state_dict(state)


def test_decode_responses_matches_decode_one_by_one(tokenizer):
    """The batched Rust decode gives tokenizer.decode's text, special tokens skipped, also when the
    tokenizer asks for space clean-up (transformers skips it for BPE); other tokenizers decode one by one."""
    from reinforge.rollout.generate import decode_responses

    special = tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [tokenizer("Hello , world ! It 's 42 .")["input_ids"] + [special], [], [special, 100, 2000, 30000]]
    want = [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    assert decode_responses(tokenizer, ids) == want and "<|im_end|>" not in want[0]
    before = tokenizer.clean_up_tokenization_spaces
    try:
        tokenizer.clean_up_tokenization_spaces = True
        assert decode_responses(tokenizer, ids) == [tokenizer.decode(x, skip_special_tokens=True) for x in ids]
    finally:
        tokenizer.clean_up_tokenization_spaces = before

    class Slow:
        def decode(self, ids, skip_special_tokens):
            return ",".join(map(str, ids))

    assert decode_responses(Slow(), [[1, 2], []]) == ["1,2", ""]
