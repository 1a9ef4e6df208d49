import numpy as np
import pytest

from jaxlib_ext.core import data, sharding


def test_embedded_corpus_is_english_and_split():
    c = data.load_corpus()
    assert c.num_tokens > 400_000 and c.vocab_size == 256
    assert 0.04 < len(c.eval) / c.num_tokens < 0.06
    text = data.ByteTokenizer().decode(c.train[:2000])
    assert "the" in text
    assert 3.0 < data.unigram_entropy(c.train, 256) < 3.6


def test_corpus_from_file_and_folder(tmp_path):
    (tmp_path / "a.txt").write_text("hello world " * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("more text " * 100)
    assert data.load_corpus(tmp_path / "a.txt").num_tokens == 1200
    assert data.load_corpus(tmp_path).num_tokens == 1200 + 2 + 1000
    with pytest.raises(FileNotFoundError, match="^path: "):
        data.load_corpus(tmp_path / "missing.txt")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no .txt"):
        data.load_corpus(tmp_path / "empty")


def test_tokenizer_round_trip():
    tok = data.ByteTokenizer()
    s = "naïve café ✓"
    assert tok.decode(tok.encode(s)) == s


def test_batches_are_a_function_of_seed_and_step():
    a = data.batch_offsets(0, 5, 16, 32, 10_000)
    assert np.array_equal(a, data.batch_offsets(0, 5, 16, 32, 10_000))
    assert not np.array_equal(a, data.batch_offsets(0, 6, 16, 32, 10_000))


def test_global_batch_from_process_local_rows():
    mesh = sharding.make_mesh("data=4,fsdp=2")
    sh = sharding.batch_sharding(mesh)
    tokens = np.arange(5000, dtype=np.int32)
    offsets = data.batch_offsets(1, 0, 16, 8, len(tokens))
    batch = data.make_global_batch(tokens, offsets, 8, sh)
    assert batch.shape == (16, 9) and batch.sharding == sh
    np.testing.assert_array_equal(np.asarray(batch)[:, 0], offsets)
    assert data.local_rows(sh, (16, 9)) == slice(0, 16)  # one process holds every row
