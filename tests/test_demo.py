"""The demo: a short run learns, the same seed gives the same numbers, divergence names its step."""

import io
import math

import numpy as np
import pytest

from arrayrnn import demo

TINY = demo.Config(steps=40, hidden=48, embed=16, batch=16, seq_len=32, lr=1e-2, eval_chars=2048,
                   sample_chars=20)


def test_short_run_learns_and_reports(tmp_path):
    out = io.StringIO()
    result = demo.run(TINY, save=str(tmp_path / "model.npz"), progress=False, out=out)
    losses = result["losses"]
    assert len(losses) == TINY.steps and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-5:]) < losses[0] - 1.0
    assert result["bpc_after"] < result["bpc_before"] - 2.0
    assert result["bpc_after"] < result["unigram_entropy"]
    text = out.getvalue()
    for needle in ("unigram entropy", "bits/char before", "bits/char after 40 steps", "sample:\nThe "):
        assert needle in text
    model, vocab, cfg = demo.load_model(str(tmp_path / "model.npz"))
    assert cfg == TINY
    ids = demo.Vocabulary(demo.load_text()).encode(demo.load_text()[-3000:])
    assert math.isclose(demo.bits_per_char(model, ids), demo.bits_per_char(model, ids))


def test_same_seed_same_numbers():
    cfg = demo.Config(steps=4, hidden=16, embed=8, batch=4, seq_len=16, seed=7)
    ids = demo.Vocabulary(demo.load_text()).encode(demo.load_text()[:20000])
    runs = [demo.train(cfg, ids, demo.CharModel(100, cfg), progress=False) for _ in range(2)]
    assert runs[0] == runs[1]
    other = demo.train(demo.Config(**{**cfg.__dict__, "seed": 8}), ids, demo.CharModel(100, cfg),
                       progress=False)
    assert other != runs[0]


def test_non_finite_loss_names_the_step():
    cfg = demo.Config(steps=3, hidden=8, embed=4, batch=2, seq_len=8)
    ids = np.arange(500) % 50
    model = demo.CharModel(50, cfg)
    model.head.params[0] = np.nan
    with pytest.raises(FloatingPointError, match="step 1: the training loss is nan"):
        demo.train(cfg, ids, model, progress=False)


def test_unigram_entropy_and_vocabulary():
    assert math.isclose(demo.unigram_entropy(np.arange(8), 8), 3.0)
    vocab = demo.Vocabulary("hello")
    assert vocab.decode(vocab.encode("hole")) == "hole" and len(vocab) == 4


def test_command_line_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        demo.main(["--steps", "0"])
    assert "--steps = 0; expected an integer >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        demo.main(["--save", "/nonexistent-dir/model.npz"])
