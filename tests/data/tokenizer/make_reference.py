"""Makes reference.json: the encodings of the texts below by Hugging Face's
`tokenizers` (an independent implementation) of tiny-v3.tokenizer.json, which
is what `mlag export --model tiny-v3` writes. Made once with

    pip install tokenizers==0.23.3
    python3 tests/data/tokenizer/make_reference.py

tests/runtime/tokenizer_test.cc checks that mlagraph's tokenizer gives the
same ids and decodes them back to the same text."""
import json
import os

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
TEXTS = [
    "Hello, world",
    "Hello, world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "1234567 and 89, 2026-12-02: 3.14159",
    "  leading spaces,   inner   runs\tand\ttabs  ",
    "line one\nline two\r\n\nline four\n",
    "naïve café, Ångström, Øresund, ß",
    "你好，世界！今天天气很好。",
    "こんにちは、カタカナとひらがな",
    "emoji 😀👍🏽 and symbols ∑∫√ €£¥",
    "<｜begin▁of▁sentence｜>Hi<｜User｜>what is 2+2?<｜Assistant｜>4<｜end▁of▁sentence｜>",
    "don't won't it's we're they've I'm you'll he'd",
    "!!!??? ... --- *** ((brackets)) [x] {y} <z>",
    "snake_case camelCase kebab-case CONSTANT_CASE path/to/file.txt",
    "",
    "x" * 300,
    "mixed中文and English123汉字",
    "\u00a0non-breaking\u2003em space\u3000ideographic",
]


def main():
    tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, "tiny-v3.tokenizer.json"))
    cases = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in TEXTS]
    out = {
        "made_by": "python3 tests/data/tokenizer/make_reference.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": "tiny-v3.tokenizer.json",
        "cases": cases,
    }
    with open(os.path.join(HERE, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
