"""Makes codepoints.json: for every Unicode scalar value c (the surrogates
are not characters) in three contexts, " " + c, c * 4 and "a" + c, how
Hugging Face's `tokenizers` (an independent implementation) splits the text
with tiny-v3.tokenizer.json's pre-tokenizer (DeepSeek V3's split patterns,
whose \\p{L}, \\p{N}, \\p{P}, \\p{S}, \\p{M} and \\s are where Unicode versions
differ) and the ids it encodes it to. Made once with

    pip install tokenizers==0.23.3
    python3 tests/data/tokenizer/make_codepoint_reference.py

The file holds, per context and per block of 256 code points, the 64-bit
FNV-1a digest of the block's record: for each code point in order,
"<hex code point>:<ids, comma-separated>|<pieces as UTF-8 hex,
comma-separated>;". tests/runtime/tokenizer_codepoint_test.cc makes the
same records with mlagraph's tokenizer and names each block that differs;
`--show BLOCK` here prints a block's records, to see where."""
import json
import os
import sys

import tokenizers

HERE = os.path.dirname(os.path.abspath(__file__))
CONTEXTS = {"space_before": lambda c: " " + c, "four_times": lambda c: c * 4,
            "after_a": lambda c: "a" + c}
FNV_OFFSET, FNV_PRIME, MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def fnv1a64(data):
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def block_records(tok, make, block):
    cps = [c for c in range(block * 256, block * 256 + 256) if not 0xD800 <= c <= 0xDFFF]
    texts = [make(chr(c)) for c in cps]
    encodings = tok.encode_batch(texts, add_special_tokens=False)
    records = []
    for c, text, enc in zip(cps, texts, encodings):
        pieces = [text[a:b].encode("utf-8").hex()
                  for _, (a, b) in tok.pre_tokenizer.pre_tokenize_str(text)]
        records.append(f"{c:X}:{','.join(map(str, enc.ids))}|{','.join(pieces)};")
    return records


def main():
    tok = tokenizers.Tokenizer.from_file(os.path.join(HERE, "tiny-v3.tokenizer.json"))
    if len(sys.argv) == 3 and sys.argv[1] == "--show":
        block = int(sys.argv[2], 0)
        for name, make in CONTEXTS.items():
            print(f"{name}:")
            for r in block_records(tok, make, block):
                print(" ", r)
        return
    digests = {}
    for name, make in CONTEXTS.items():
        digests[name] = [f"{fnv1a64(''.join(block_records(tok, make, b)).encode()):016x}"
                         for b in range(0x110000 // 256)]
    out = {
        "made_by": "python3 tests/data/tokenizer/make_codepoint_reference.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": "tiny-v3.tokenizer.json",
        "block_size": 256,
        "digest": "FNV-1a 64 of the block's records",
        "contexts": digests,
    }
    with open(os.path.join(HERE, "codepoints.json"), "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
