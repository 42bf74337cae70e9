#!/usr/bin/env python3
"""Writes the tokenizer comparison corpus (one JSON string per line) to stdout.
Small for now: hand-made edge cases plus 20-line chunks of /usr/include/*.h. Seed 1."""
import glob, json, random
random.seed(1)
out = ["Hello world", "I'M here, don't \r\n 12345 ６７", "  leading spaces", "tabs\tand\nnewlines\n\n",
       "<|im_start|>user hi<|im_end|>", "😀👨‍👩‍👧 emoji", "中文测试，日本語のテキスト", "Ünïcödé café naïve",
       "x" * 300, " a  b   c    d", "'S 'T 'RE 'll 'VE", "3.14159 1,000,000 ۱۲۳", "\u00a0\u2003\u3000spaces"]
for f in sorted(glob.glob("/usr/include/*.h"))[:60]:
    try:
        lines = open(f, encoding="utf-8").read().split("\n")
    except Exception:
        continue
    for i in range(0, len(lines), 20):
        out.append("\n".join(lines[i:i + 20]))
random.shuffle(out)
for s in out[:600]:
    print(json.dumps(s))
