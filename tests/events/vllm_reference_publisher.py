#!/usr/bin/env python3
"""An independent vLLM KV event publisher, written from the message definitions
of vLLM's vllm/distributed/kv_events.py (KVEventBatch, BlockStored,
BlockRemoved, AllBlocksCleared; msgspec structs with omit_defaults, tag=True;
array_like in the positional layout) and its ZmqEventPublisher wire protocol.
It does not use kvroute's encoder: msgpack (python3-msgpack) and ZMQ
(python3-zmq) only.

Protocol with the test driving it (tests/events/zmq_reference_test.cpp):
  stdout  "ENDPOINTS <pub> <replay>"   after binding (port 0 = free ports)
          phase 1 is then published at once (before any subscriber: a late
          router must get it by replay from seq 0)
  stdin   "go"                         publish phase 2 (with one frame dropped:
                                       numbered and buffered, never sent live)
  stdout  "EXPECT <json>"              what the router's index must hold
  stdin   "quit" or EOF                exit
Replay requests are served all the time, as vLLM does: ROUTER receives
[identity, b"", start_seq (8 bytes BE)] and answers [identity, b"", seq,
payload] per buffered batch with seq >= start_seq, then [identity, b"",
(-1 as 8 bytes), b""].
"""
import hashlib
import json
import os
import select
import sys
import time

import msgpack
import zmq

BLOCK = 4
# Positional field order of BlockStored after the tag (vLLM's declaration order).
STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                 "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
STORED_DEFAULTED = {"extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
REMOVED_FIELDS = ["block_hashes", "medium", "group_idx"]
REMOVED_DEFAULTED = {"group_idx"}


def encode_event(ev, positional):
    """ev: dict with "type" and fields. Fields with defaults are omitted when None
    (omit_defaults); positional drops only trailing ones (array_like)."""
    kind = ev["type"]
    order = STORED_FIELDS if kind == "BlockStored" else REMOVED_FIELDS if kind == "BlockRemoved" else []
    defaulted = STORED_DEFAULTED if kind == "BlockStored" else REMOVED_DEFAULTED
    if positional:
        values = [ev.get(f) for f in order]
        extra = [ev[k] for k in ev if k.startswith("x_")]  # fields unknown to the reader, after all known ones
        while not extra and values and order[len(values) - 1] in defaulted and values[-1] is None:
            values.pop()
        return [kind] + values + extra
    out = {"type": kind}
    for f in order:
        if f in defaulted and ev.get(f) is None:
            continue
        out[f] = ev.get(f)
    for k in ev:
        if k not in out and k != "type":
            out[k[2:] if k.startswith("x_") else k] = ev[k]
    return out


def encode_batch(events, positional, rank=0):
    ts = time.time()
    evs = [encode_event(e, positional) for e in events]
    obj = [ts, evs, rank] if positional else {"ts": ts, "events": evs, "data_parallel_rank": rank}
    return msgpack.packb(obj, use_bin_type=True)


def int_form(h):
    """vLLM's maybe_convert_block_hash with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES."""
    return int.from_bytes(h, byteorder="big") & ((1 << 64) - 1)


def sha_hash(*parts):
    """A bytes block hash, as vLLM's sha256 hashing gives."""
    return hashlib.sha256(repr(parts).encode()).digest()


def tokens(seed, blocks):
    return [(seed * 7919 + i * 31) % 50000 + 1000 for i in range(blocks * BLOCK)]


TIERS = ["device", "host_pinned"]  # best first


def tier_of(medium):
    return "host_pinned" if medium == "CPU" else "device"


class Model:
    """What the engine caches: engine hash -> block (parent, tokens, namespace,
    the tiers it is held in: a copy in each)."""

    def __init__(self):
        self.blocks = {}

    def stored(self, hashes, parent, toks, lora=None, salt=None, medium="GPU"):
        for i, h in enumerate(hashes):
            p = parent if i == 0 else hashes[i - 1]
            root_ns = (lora, salt if p is None else None)
            self.blocks[self.key(h)] = {"parent": None if p is None else self.key(p),
                                        "tokens": toks[i * BLOCK:(i + 1) * BLOCK], "lora": lora,
                                        "salt": root_ns[1], "tiers": {tier_of(medium)}}

    def copied(self, hashes, medium):
        for h in hashes:
            if self.key(h) in self.blocks:
                self.blocks[self.key(h)]["tiers"].add(tier_of(medium))

    def removed(self, hashes, medium="GPU"):
        for h in hashes:
            b = self.blocks.get(self.key(h))
            if b is None:
                continue
            b["tiers"].discard(tier_of(medium))
            if not b["tiers"]:
                del self.blocks[self.key(h)]

    def cleared(self):
        self.blocks.clear()

    @staticmethod
    def key(h):
        # A bytes hash and its int form (vLLM's VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES) are one block.
        return str(int_form(h) if isinstance(h, bytes) else h % (1 << 64))

    def expect(self):
        out = []
        for k in self.blocks:
            path, tiers, cur = [], [], k
            while cur is not None:
                b = self.blocks[cur]
                path = b["tokens"] + path
                tiers = [min(b["tiers"], key=TIERS.index)] + tiers
                root = b
                cur = b["parent"]
            out.append({"tokens": path, "lora": root["lora"] or "", "salt": root["salt"] or "", "tiers": tiers})
        return out


def stored_ev(model, hashes, parent, toks, lora=None, salt=None, medium="GPU", group=0, kind="full_attention",
              extra=None, index=True, **unknown):
    if index:
        model.stored(hashes, parent, toks, lora, salt, medium)
    extra_keys = None
    if lora or salt:
        extra_keys = []
        for i in range(len(hashes)):
            keys = ([lora] if lora else []) + ([salt] if salt and i == 0 and parent is None else [])
            extra_keys.append(keys or None)
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": toks,
          "block_size": BLOCK, "lora_id": 1 if lora else None, "medium": medium, "lora_name": lora,
          "extra_keys": extra_keys if extra is None else extra, "group_idx": group, "kv_cache_spec_kind": kind}
    ev.update({"x_" + k: v for k, v in unknown.items()})
    return ev


def phase1(model):
    """(events, positional) per batch: both encodings, int and bytes hashes,
    LoRA + cache_salt, CPU medium, AllBlocksCleared, unknown fields and types,
    a sliding-window group that must not be indexed."""
    z = [901, 902]
    a = [1001, 1002]
    b = [sha_hash("b", i) for i in range(3)]
    c = [(1 << 63) + 5, (1 << 63) + 6]  # above int64: msgpack uint64
    d = [-77]                            # negative int hash
    batches = []
    batches.append(([stored_ev(model, z, None, tokens(9, 2))], True))
    model.cleared()
    batches.append(([{"type": "AllBlocksCleared"}, stored_ev(model, a, None, tokens(1, 2))], False))
    batches.append(([stored_ev(model, b, None, tokens(2, 3), lora="sql-lora", salt="tenant-x")], False))
    batches.append(([stored_ev(model, c, None, tokens(3, 2), medium="CPU", future_field={"nested": [1, [2]]}),
                     {"type": "BlockPinned", "block_hashes": [1]}], False))
    batches.append(([stored_ev(model, d, a[-1], tokens(4, 1), salt="ignored-not-first", extra=[None]),
                     # hybrid model: the sliding-window group has the same hashes; never indexed, and its
                     # removal must not remove the full-attention blocks
                     stored_ev(model, a, None, tokens(1, 2), group=1, kind="sliding_window", index=False),
                     {"type": "BlockRemoved", "block_hashes": a, "medium": "GPU", "group_idx": 1}], True))
    return batches


def copies_ev(model, hashes):
    """vLLM's OffloadingConnector: CPU copies of the engine's blocks, by hash
    only (its scheduler's take_events(): no parent, no token_ids)."""
    model.copied(hashes, "CPU")
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "token_ids": [],
            "block_size": BLOCK, "lora_id": None, "medium": "CPU", "lora_name": None}


def phase2(model):
    f = [2001, 2002]
    g = [2003]
    h = [sha_hash("h", i) for i in range(2)]
    model_removed = [(1 << 63) + 6]
    batches = []
    batches.append(([stored_ev(model, f, None, tokens(5, 2))], True))     # dropped live: replay must bring it
    batches.append(([stored_ev(model, g, f[-1], tokens(6, 1))], False))   # its parent is in the dropped frame
    model.removed(model_removed, "CPU")
    batches.append(([{"type": "BlockRemoved", "block_hashes": model_removed, "medium": "CPU"}], True))
    # CPU offloading: copies of f's blocks and of h's (bytes hashes), then the
    # GPU lets f's first block and h's go: they stay cached, on the CPU; the
    # CPU then lets h's last go (gone); a CPU removal of g, never copied,
    # leaves g on the GPU.
    batches.append(([stored_ev(model, h, None, tokens(7, 2)), copies_ev(model, f + h + [9999])], False))
    model.removed(f[:1] + h, "GPU")
    model.removed(h[1:], "CPU")
    model.removed(g, "CPU")
    batches.append(([{"type": "BlockRemoved", "block_hashes": f[:1] + h, "medium": "GPU"},
                     {"type": "BlockRemoved", "block_hashes": h[1:], "medium": "CPU"},
                     {"type": "BlockRemoved", "block_hashes": g, "medium": "CPU"}], True))
    # The GPU's events with int hashes (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES),
    # the connector's with the same hashes as bytes: still the same blocks.
    k = [sha_hash("k", i) for i in range(2)]
    k_int = [int_form(b) for b in k]
    batches.append(([stored_ev(model, k_int, None, tokens(8, 2)), copies_ev(model, k)], False))
    model.removed(k_int, "GPU")
    batches.append(([{"type": "BlockRemoved", "block_hashes": k_int, "medium": "GPU"}], True))
    return batches


def main():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind("tcp://127.0.0.1:*")
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind("tcp://127.0.0.1:*")
    topic = os.environ.get("KV_TOPIC", "kv").encode()
    buffer = []  # (seq, payload), as vLLM's replay deque
    seq = [0]
    model = Model()

    def publish(payload, send_live=True):
        s = seq[0]
        seq[0] += 1
        if send_live:
            pub.send_multipart([topic, s.to_bytes(8, "big"), payload])
        buffer.append((s, payload))

    def serve_replays():
        while router.poll(0):
            frames = router.recv_multipart()
            if len(frames) != 3:
                continue
            ident, _, start = frames
            start = int.from_bytes(start, "big")
            for s, payload in buffer:
                if s >= start:
                    router.send_multipart([ident, b"", s.to_bytes(8, "big"), payload])
            router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])

    print("ENDPOINTS", pub.getsockopt(zmq.LAST_ENDPOINT).decode(), router.getsockopt(zmq.LAST_ENDPOINT).decode(),
          flush=True)
    for events, positional in phase1(model):
        publish(encode_batch(events, positional))
    phase = 1
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        serve_replays()
        r, _, _ = select.select([stdin], [], [], 0.005)
        if not r:
            continue
        chunk = os.read(stdin, 4096)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            cmd = line.strip().decode()
            if cmd == "quit":
                return
            if cmd == "go" and phase == 1:
                phase = 2
                for i, (events, positional) in enumerate(phase2(model)):
                    publish(encode_batch(events, positional), send_live=(i != 0))
                print("EXPECT", json.dumps({"blocks": len(model.blocks), "chains": model.expect()}), flush=True)


if __name__ == "__main__":
    main()
