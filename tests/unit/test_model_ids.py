"""``model.path`` as a Hugging Face model id, resolved from the local hub cache without network."""

import shutil

import pytest

from reinforge.models.hub import pull_model, resolve_model_path
from reinforge.models.loading import load_tokenizer

REV = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(root, repo, source, rev=REV, ref="main"):
    """The hub cache layout: models--Org--Name/{refs/<ref>, snapshots/<rev>/...} (blobs omitted)."""
    repo_dir = root / f"models--{repo.replace('/', '--')}"
    snap = repo_dir / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file():
            shutil.copy2(f, snap / f.name)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / ref).write_text(rev)
    return snap


def test_model_id_resolves_from_the_local_hub_cache(tmp_path, monkeypatch, tiny_model_path):
    cache = tmp_path / "hub"
    snap = fake_cache(cache, "Qwen/Qwen2.5-0.5B-Instruct", tiny_model_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == snap
    assert resolve_model_path(f"Qwen/Qwen2.5-0.5B-Instruct@{REV}") == snap
    assert load_tokenizer(resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")).eos_token is not None
    # HF_HOME/hub when HF_HUB_CACHE is unset
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct") == snap


def test_missing_model_id_says_where_it_looked(tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    msg = str(e.value)
    assert str(tmp_path / "Qwen" / "Qwen2.5-0.5B-Instruct") in msg  # the local path
    assert str(cache / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots") in msg and "refs/main" in msg
    assert "does not exist" in msg and "hf download Qwen/Qwen2.5-0.5B-Instruct" in msg


def test_cached_snapshot_without_config_is_not_a_model(tmp_path, monkeypatch):
    """A partial download (no config.json in the snapshot) is reported as not found."""
    cache = tmp_path / "hub"
    src = tmp_path / "src"
    src.mkdir()
    (src / "tokenizer.json").write_text("{}")
    fake_cache(cache, "Org/Partial", src)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    with pytest.raises(FileNotFoundError, match="models--Org--Partial"):
        resolve_model_path("Org/Partial")


@pytest.mark.parametrize(
    "typed,meant",
    [
        ("smollm2-135m", "smollm2-135m-instruct"),  # a prefix of the known name (issue 38 item 8)
        ("smolm2-135m-instruct", "smollm2-135m-instruct"),  # a misspelling
        ("Qwen/Qwen2.5-0.5B-Instrct", "Qwen/Qwen2.5-0.5B-Instruct"),  # a hub id in the cache, misspelt
        ("Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),  # the organisation left out
    ],
)
def test_unknown_model_name_suggests_the_close_known_one(tmp_path, monkeypatch, typed, meant):
    cache = tmp_path / "hub"
    (cache / "models--Qwen--Qwen2.5-0.5B-Instruct").mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_path(typed)
    assert f"not found. Did you mean {meant!r}?" in str(e.value)


def test_unrelated_model_name_gets_no_suggestion(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        resolve_model_path("gpt2")
    assert "did you mean" not in str(e.value).lower()


def test_models_pull_of_a_near_name_suggests_the_known_one():
    with pytest.raises(KeyError, match=r"unknown model 'smollm2-135m' \(did you mean 'smollm2-135m-instruct'\?\)"):
        pull_model("smollm2-135m")
