"""Corpus BLEU and chrF with sacrebleu, on detokenised text.

sacrebleu tokenizes internally (13a by default, the WMT standard), so the
inputs must be plain detokenised strings (what `SentencePieceVocab.decode`
returns), never pre-tokenised text. Report the signature with the score: it
pins the tokenizer, casing, smoothing and version, without which BLEU numbers
are not comparable.

    result = corpus_bleu(hypotheses, references)
    print(f"BLEU {result.score:.2f}  {result.signature}")
"""

import dataclasses
from typing import List, Sequence, Tuple, Union

from tpu_models.errors import MissingExtraError

Text = Union[str, bytes]


@dataclasses.dataclass(frozen=True)
class BleuResult:
  score: float  # 0..100
  signature: str  # e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
  precisions: Tuple[float, ...]  # 1- to 4-gram precisions, 0..100.
  brevity_penalty: float
  hypothesis_length: int
  reference_length: int

  def __str__(self) -> str:
    return f"BLEU {self.score:.2f} ({self.signature})"


@dataclasses.dataclass(frozen=True)
class ChrfResult:
  score: float  # 0..100
  signature: str

  def __str__(self) -> str:
    return f"chrF {self.score:.2f} ({self.signature})"


def _sacrebleu_metrics():
  try:
    from sacrebleu import metrics  # Optional extra: only for evaluation.
  except ImportError:
    raise MissingExtraError('BLEU needs the optional package sacrebleu: '
                            'pip install "tpu_models[text]"') from None
  return metrics


def _as_text(values: Sequence[Text], what: str) -> List[str]:
  texts = []
  for i, value in enumerate(values):
    if isinstance(value, bytes):
      value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str):
      raise TypeError(f"{what}[{i}] is {type(value).__name__}, expected a string.")
    texts.append(value)
  return texts


def _prepare(hypotheses: Sequence[Text], references) -> Tuple[List[str], List[List[str]]]:
  """Hypotheses and reference streams (one list per reference set) as str."""
  hypotheses = _as_text(hypotheses, "hypotheses")
  if not hypotheses:
    raise ValueError("BLEU of an empty corpus is undefined: no hypotheses given.")
  if references and not isinstance(references[0], (str, bytes)):
    streams = [_as_text(stream, f"references[{j}]") for j, stream in enumerate(references)]
  else:
    streams = [_as_text(references, "references")]
  for j, stream in enumerate(streams):
    if len(stream) != len(hypotheses):
      raise ValueError(f"{len(hypotheses)} hypotheses but reference set {j} has "
                       f"{len(stream)} sentences; they must align one to one.")
  return hypotheses, streams


def corpus_bleu(hypotheses: Sequence[Text],
                references: Union[Sequence[Text], Sequence[Sequence[Text]]],
                *,
                tokenize: str = "13a",
                lowercase: bool = False) -> BleuResult:
  """sacreBLEU over a corpus.

  Args:
    hypotheses: [N] detokenised system outputs (str or UTF-8 bytes).
    references: [N] reference translations, or several reference sets,
      each [N] (sacrebleu's layout).
    tokenize: sacrebleu tokenizer ("13a", "intl", "char", "none", ...).
    lowercase: case-insensitive BLEU (shows as case:lc in the signature).

  Returns:
    The score (0..100), sacrebleu's signature string and the statistics.
  """
  BLEU = _sacrebleu_metrics().BLEU
  hypotheses, streams = _prepare(hypotheses, references)
  metric = BLEU(tokenize=tokenize, lowercase=lowercase)
  result = metric.corpus_score(hypotheses, streams)
  return BleuResult(score=float(result.score), signature=str(metric.get_signature()),
                    precisions=tuple(float(p) for p in result.precisions),
                    brevity_penalty=float(result.bp), hypothesis_length=int(result.sys_len),
                    reference_length=int(result.ref_len))


def corpus_chrf(hypotheses: Sequence[Text],
                references: Union[Sequence[Text], Sequence[Sequence[Text]]]) -> ChrfResult:
  """sacrebleu chrF (character n-gram F-score, 0..100) over a corpus; see `corpus_bleu`."""
  CHRF = _sacrebleu_metrics().CHRF
  hypotheses, streams = _prepare(hypotheses, references)
  metric = CHRF()
  result = metric.corpus_score(hypotheses, streams)
  return ChrfResult(score=float(result.score), signature=str(metric.get_signature()))
