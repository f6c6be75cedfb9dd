"""Corpus BLEU / chrF through sacrebleu."""

import pytest
import sacrebleu

from tpu_models.text import bleu

REFERENCES = [
    "The cat is on the mat.",
    "There is a cat on the mat.",
    "He went through the roof when he heard the news.",
    "Fortune favours the brave.",
]
HYPOTHESES = [
    "The cat sits on the mat.",
    "A cat is on the mat.",
    "He hit the roof when he heard about the news.",
    "Luck favours the brave ones.",
]


def test_identical_corpus_scores_100():
  result = bleu.corpus_bleu(REFERENCES, REFERENCES)
  assert result.score == pytest.approx(100.0)
  assert result.brevity_penalty == pytest.approx(1.0)
  assert bleu.corpus_chrf(REFERENCES, REFERENCES).score == pytest.approx(100.0)


def test_agrees_with_sacrebleu_called_directly():
  result = bleu.corpus_bleu(HYPOTHESES, REFERENCES)
  expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
  assert 0 < result.score < 100
  assert result.score == pytest.approx(expected.score, abs=1e-9)
  assert result.precisions == pytest.approx(tuple(expected.precisions))
  assert result.hypothesis_length == expected.sys_len
  assert result.reference_length == expected.ref_len
  chrf = bleu.corpus_chrf(HYPOTHESES, REFERENCES)
  assert chrf.score == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
  # Bytes (what tf.string tensors give) score like str.
  as_bytes = bleu.corpus_bleu([h.encode() for h in HYPOTHESES], [r.encode() for r in REFERENCES])
  assert as_bytes.score == pytest.approx(result.score)


def test_signature_and_options():
  result = bleu.corpus_bleu(HYPOTHESES, REFERENCES)
  assert "tok:13a" in result.signature and "nrefs:1" in result.signature
  assert f"version:{sacrebleu.__version__}" in result.signature
  assert result.signature in str(result)
  lower = bleu.corpus_bleu([h.upper() for h in HYPOTHESES], REFERENCES, lowercase=True)
  assert "case:lc" in lower.signature
  assert lower.score == pytest.approx(
      bleu.corpus_bleu(HYPOTHESES, REFERENCES, lowercase=True).score)
  assert bleu.corpus_bleu([h.upper() for h in HYPOTHESES], REFERENCES).score < 5
  # Two reference sets: the second one matches the hypotheses exactly.
  two = bleu.corpus_bleu(HYPOTHESES, [REFERENCES, HYPOTHESES])
  assert two.score == pytest.approx(100.0) and "nrefs:2" in two.signature
  assert "chrF" in str(bleu.corpus_chrf(HYPOTHESES, REFERENCES))


def test_bad_input():
  with pytest.raises(ValueError, match="3 hypotheses but reference set 0 has 4"):
    bleu.corpus_bleu(HYPOTHESES[:3], REFERENCES)
  with pytest.raises(ValueError, match="empty corpus"):
    bleu.corpus_bleu([], [])
  with pytest.raises(TypeError, match=r"hypotheses\[1\] is int"):
    bleu.corpus_bleu(["a", 3], ["a", "b"])
