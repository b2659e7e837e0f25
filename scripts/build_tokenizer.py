"""Build the small tokenizer zarr_skip ships (zarr_skip/synthetic/tokenizer.json), reproducibly.

A byte-level BPE trained with the ``tokenizers`` library on text the project generates itself
(:func:`zarr_skip.synthetic.text.training_corpus`: maths prompts in the Qwen2 chat template and
worked answers), with the special tokens ``<|endoftext|>`` (0, padding), ``<|im_start|>`` (1) and
``<|im_end|>`` (2, end of a turn). Nothing is downloaded. Run::

    .venv/bin/python scripts/build_tokenizer.py            # rewrites the shipped file
    .venv/bin/python scripts/build_tokenizer.py --out x.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from zarr_skip.synthetic.text import SPECIAL_TOKENS, TOKENIZER_PATH, training_corpus

VOCAB_SIZE = 640


def build(out: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    out.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(out), pretty=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TOKENIZER_PATH)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    path = build(args.out, args.vocab_size)
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
