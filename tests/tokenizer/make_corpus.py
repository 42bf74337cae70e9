#!/usr/bin/env python3
"""Writes the tokenizer comparison corpus (one JSON string per line) to stdout.

Sources (Debian packages installed by scripts/setup.sh; seed 1, deterministic):
  fortunes, fortunes-{de,es,ru,it,cs,zh}  quotes in 7 languages (one per string)
  wamerican                               random word sequences, case and contraction variants
  unicode-data                            emoji-test.txt sequences, NormalizationTest.txt columns
  libc6-dev headers, python3 stdlib       source code, 20-line chunks
plus hand-made edge cases: every Unicode space, \\r\\n, contractions in both
cases, full-width digits, literal special-token text, very long runs.

A missing source is an error (exit 1): the corpus never shrinks silently.
Usage: make_corpus.py [--small] > corpus.jsonl   (--small: ~1/8 of each source, for quick runs)
"""
import bz2
import glob
import json
import os
import random
import sys

SMALL = "--small" in sys.argv
rng = random.Random(1)
FORT = "/usr/share/games/fortunes"
UCD = "/usr/share/unicode"


def die(msg):
    print(f"make_corpus.py: {msg}", file=sys.stderr)
    sys.exit(1)


def need(path):
    if not os.path.exists(path):
        die(f"missing corpus source {path} (install the packages listed in scripts/setup.sh)")
    return path


def quota(n):
    return max(1, n // 8) if SMALL else n


def sample(items, n, what):
    items = [s for s in items if s.strip()]
    if len(items) < n:
        die(f"{what}: only {len(items)} items, need {n}")
    return rng.sample(items, n)


def fortunes(paths):
    out = []
    for p in sorted(paths):
        if p.endswith((".dat", ".u8")) or os.path.islink(p) or not os.path.isfile(p):
            continue
        text = open(p, "rb").read().decode("utf-8", errors="replace")
        out += [q.strip("\n") for q in text.split("\n%\n")]
    return out


corpus = []

# Quotes in several languages.
need(FORT)
langs = [("en", glob.glob(f"{FORT}/*"), 800), ("de", glob.glob(f"{FORT}/de/*"), 400),
         ("es", glob.glob(f"{FORT}/es/*"), 300), ("ru", glob.glob(f"{FORT}/ru/*"), 400),
         ("it", glob.glob(f"{FORT}/it/*"), 300), ("cs", glob.glob(f"{FORT}/cs/*"), 300),
         ("zh", [need(f"{FORT}/chinese")], 400)]
for name, paths, n in langs:
    if not paths:
        die(f"no fortunes for {name} under {FORT}")
    corpus += sample(fortunes(paths), quota(n), f"fortunes-{name}")

# Word sequences with case and contraction variants.
words = [w for w in open(need("/usr/share/dict/american-english"), encoding="utf-8").read().split("\n") if w]
suffixes = ["", "", "", "'s", "'S", "'re", "'RE", "'ll", "'LL", "'ve", "'d", "'M", "'t", "n't", "N'T"]
for _ in range(quota(400)):
    ws = []
    for w in rng.sample(words, rng.randint(3, 30)):
        r = rng.random()
        w = w.upper() if r < 0.15 else w.capitalize() if r < 0.35 else w
        ws.append(w + rng.choice(suffixes))
    seps = [" ", " ", " ", ", ", ". ", "  ", "\n", "\t", " - ", "; "]
    corpus.append("".join(w + rng.choice(seps) for w in ws).rstrip())

# Emoji sequences (ZWJ, skin tones, flags, keycaps) mixed with text.
emoji = []
for line in open(need(f"{UCD}/emoji/emoji-test.txt"), encoding="utf-8"):
    if ";" in line and not line.startswith("#"):
        emoji.append("".join(chr(int(c, 16)) for c in line.split(";")[0].split()))
if len(emoji) < 1000:
    die("emoji-test.txt: too few sequences")
for _ in range(quota(300)):
    parts = [rng.choice(emoji) for _ in range(rng.randint(1, 8))]
    glue = rng.choice(["", " ", " and ", "\n", "text"])
    corpus.append(glue.join(parts) + rng.choice(["", " ok", "!", " 😀"]))

# Normalization test columns (source, NFC, NFD, NFKC, NFKD), three lines per string.
norm_lines = []
with bz2.open(need(f"{UCD}/NormalizationTest.txt.bz2"), "rt", encoding="utf-8") as f:
    for line in f:
        if line[0] in "#@":
            continue
        cols = line.split(";")[:5]
        norm_lines.append(" ".join("".join(chr(int(c, 16)) for c in col.split()) for col in cols))
picked = sample(norm_lines, quota(1500), "NormalizationTest")
for i in range(0, len(picked), 3):
    corpus.append(rng.choice([" ", "x", "\n", "a "]).join(picked[i:i + 3]))


def chunks(paths, n, what):
    out = []
    for p in sorted(paths):
        try:
            lines = open(p, encoding="utf-8").read().split("\n")
        except (UnicodeDecodeError, OSError):
            continue
        out += ["\n".join(lines[i:i + 20]) for i in range(0, len(lines), 20)]
    return sample(out, n, what)


corpus += chunks(glob.glob(need("/usr/include") + "/*.h"), quota(500), "C headers")
corpus += chunks(glob.glob(need(sorted(glob.glob("/usr/lib/python3.*"))[0] if glob.glob("/usr/lib/python3.*")
                                else "/usr/lib/python3") + "/*.py"), quota(300), "python sources")

# Hand-made edge cases.
spaces = [chr(c) for c in [0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028,
                           0x2029, 0x202F, 0x205F, 0x3000, 0x180E, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF]]
edge = ["", " ", "  ", "\n", "\r\n", "\r\n\r\n", "a\r\nb", " \r\n ", "\t\r\n\t", "Hello world",
        "I'M here, don't \r\n 12345 ６７", "'S 'T 'RE 'll 'VE 'd 'M", "DON'T WON'T I'LL YOU'RE WE'VE HE'D I'M",
        "don't won't i'll you're we've he'd i'm", "Don'T dOn't", "’s ’t curly’re", "''s '''t",
        "０１２３４５６７８９ full-width ＡＢＣ ａｂｃ", "1234567890 123 1 12 1234", "3.14159 1,000,000 ۱۲۳ ١٢٣ १२३",
        "tabs\tand\nnewlines\n\n", " a  b   c    d     e", "\u00a0\u2003\u3000spaces", "中文测试，日本語のテキスト、한국어",
        "Ünïcödé café naïve résumé", "e\u0301 a\u0300 o\u0308 n\u0303", "\u1100\u1161\u11a8 한글", "Å Å Å",
        "ﬁ ﬂ ﬀ ligatures", "x\u0323\u0307 \u1e0b\u0323", "😀👨‍👩‍👧 emoji 🇩🇪🇫🇷 1️⃣ 👍🏽", "<tag attr=\"v\">&amp;</tag>", "<p> </p> <br> </br>\n<b>  </b>",
        "https://example.com/path?q=1&r=2#frag", "user@example.com", "$$$ %%% ^^^ &&& *** ((()))", "a\u0000b\u0001c",
        "\x1b[31mred\x1b[0m", "🂡🂢 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚", "\U0001FAE8 \U0001FAF8 \U0001F6DC newer emoji", "ǅ ǈ ǋ ǲ titlecase"]
edge += ["".join(spaces), " ".join(spaces), "x".join(spaces) + "x"]
edge += [f"{s}word{s}" for s in spaces] + [f"a{s}{s}b" for s in spaces]
specials = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>", "<|start_header_id|>",
            "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<pad>", "<mask>",
            "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|EOT|>", "<|endofprompt|>", "<|startoftext|>",
            "<|reserved_special_token_0|>", "<|reserved_200000|>", "<tool_call>", "<unused0>", "[multimodal]",
            "<0x0A>", "<|fim_prefix|>", "<｜fim▁hole｜>"]
for s in specials:
    edge += [s, f"hi {s} there", f"{s}{s}", f" {s}\n", f"x{s}y", s.upper(), s[:-1], f"<{s}>"]
edge.append("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
edge.append("<bos><start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n")
edge += ["x" * 300, "a" * 5000, " " * 5000, "\n" * 3000, "1" * 4000, "!" * 3000, "ab" * 3000, "é" * 3000,
         "中" * 3000, "😀" * 1500, "\t" * 2000, " \n" * 2000, "A" * 50000, "aB1 " * 10000, "x" + " " * 20000 + "y"]
edge += [" " * k + "a" for k in range(1, 18)] + ["a" + " " * k for k in range(1, 18)]
edge += ["▁ ▁▁ ▁a a▁b", "\u2581hello", "  \u2581  "]
corpus += edge

for s in corpus:
    print(json.dumps(s, ensure_ascii=False))
