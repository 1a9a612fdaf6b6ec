#!/usr/bin/python3
"""make-seeds.py — writes the seed corpora of fuzz/corpus/ (run once; the files are in the
repository). Real inputs, small: specs like examples/seed.json, event lines as CONTRACT.md
§6 shows them, .npy files written by numpy.save, CSV files as spreadsheets write them,
safetensors files in the format of CONTRACT.md §4 (torch tensors' bytes), the CPU
backend's frames as comm/cpu/ lays them out, and HTTP requests as curl sends them."""
import hashlib
import hmac
import io
import json
import os
import struct

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def put(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# ---- spec
seed = open(os.path.join(HERE, "..", "examples", "seed.json")).read()
put("spec", "seed.json", seed)
base = json.loads(seed)
specs = {
    "full_defaults": dict(base, world_size=2, grad_accum=1, ddp={"bucket_cap_mb": 25, "join": "auto",
                          "divide_by_initial_world_size": True, "timeout_s": 300, "backend": "cpu"},
                          init={"seed": 0}, checkpoint={"every_steps": 0}, max_restarts=0),
    "mlp_ce_adamw": dict(base, model=[{"type": "linear", "in": 8, "out": 16}, {"type": "relu"},
                                      {"type": "linear", "in": 16, "out": 16, "bias": False}, {"type": "gelu"},
                                      {"type": "linear", "in": 16, "out": 4}, {"type": "tanh"},
                                      {"type": "sigmoid"}],
                         loss="cross_entropy",
                         optimizer={"type": "adamw", "lr": 0.001, "betas": [0.9, 0.999], "eps": 1e-8,
                                    "weight_decay": 0.01}),
    "npy_rank": dict(base, data={"type": "npy", "x": "shards/x_{rank}.npy", "y": "shards/y_{rank}.npy",
                                 "shuffle": False, "drop_last": True, "seed": 7}),
    "csv_targets": dict(base, model=[{"type": "linear", "in": 3, "out": 2}],
                        data={"type": "csv", "path": "d.csv", "target": ["y1", "y2"]}),
    "steps_sgd_momentum": dict({k: v for k, v in base.items() if k != "epochs"}, steps=100,
                               optimizer={"type": "sgd", "lr": 0.1, "momentum": 0.9, "dampening": 0,
                                          "weight_decay": 1e-4, "nesterov": True},
                               ddp={"join": False, "bucket_cap_mb": 0.5}, init={"from": "w.safetensors"},
                               checkpoint={"every_steps": 10, "keep_last": 2}, log_every=5, max_restarts=2),
    "cuda_nccl": dict(base, device="cuda", ddp={"backend": "nccl", "join": True}),
    "on_nonfinite": dict(base, on_nonfinite="continue"),
    # issue 31: the watches of an eval metric
    "early_stop": dict(base, model=[{"type": "linear", "in": 10, "out": 3}], loss="cross_entropy",
                       eval={"data": {"type": "synthetic", "samples": 30}, "every_steps": 5},
                       early_stop={"metric": "eval_accuracy", "mode": "max", "patience": 2, "min_delta": 0.01},
                       checkpoint={"every_steps": 10, "keep_best": {"metric": "eval_loss", "mode": "min"}}),
}
# Sizes at and near the limits (issue 15): batch_size and samples near INT64_MAX (the
# batch arithmetic and every buffer a batch sizes), widths at the 1048576 cap, 64 layers,
# grad_accum and epochs near INT64_MAX, 1024 ranks.
I64 = 2**63 - 1
WIDE = [{"type": "linear", "in": 1048576, "out": 1048576}, {"type": "relu"},
        {"type": "linear", "in": 1048576, "out": 2}]
specs.update({
    "size_batch_2p62": dict(base, model=[{"type": "linear", "in": 1, "out": 1}], batch_size=2**62,
                            data={"type": "synthetic", "samples": 100}),
    "size_int64_max": dict(base, batch_size=I64, data={"type": "synthetic", "samples": I64, "drop_last": True},
                           grad_accum=I64, epochs=I64, log_every=I64, world_size=1024),
    "size_near_max": dict(base, batch_size=I64 - 1, data={"type": "synthetic", "samples": I64 - 1, "seed": I64},
                          grad_accum=I64 - 1, checkpoint={"every_steps": I64}),
    "size_wide_ce": dict(base, model=WIDE, loss="cross_entropy", optimizer={"type": "adamw"}, world_size=1024,
                         batch_size=2**31, data={"type": "npy", "x": "x.npy", "y": "y.npy"}),
    "size_64_layers": dict(base, model=[{"type": "linear", "in": 1048576, "out": 1048576}] * 63 +
                           [{"type": "gelu"}], batch_size=1_000_000_000, data={"type": "synthetic", "samples": 300}),
    "size_over_cap": dict(base, model=[{"type": "linear", "in": 1048577, "out": 5}], batch_size=I64),
})
for name, s in specs.items():
    put("spec", name + ".json", json.dumps(s, indent=1))
put("spec", "bad_typo.json", seed.replace('"epochs"', '"epoch"'))
put("spec", "bad_dotdot.json", json.dumps(dict(base, data={"type": "npy", "x": "../x.npy", "y": "y.npy"})))
put("spec", "bad_json.json", '{"name": "x",\n "model": [,]}')

# ---- event (CONTRACT.md §6)
events = [
    '{"event":"start","rank":0,"world_size":2,"device":"cpu","params":55,"batches":1000,"ts":1764680000.123}',
    '{"event":"loss","rank":0,"step":17,"epoch":0,"loss":0.2345,"samples_per_s":51234.5,"ts":1764680001.5}',
    '{"event":"loss","rank":1,"step":18,"epoch":0,"loss":null,"nonfinite":true,"samples_per_s":1.0,"ts":1.0}',
    '{"event":"join","rank":1,"step":499,"ts":1764680002}',
    '{"event":"checkpoint","rank":0,"step":500,"path":"var/jobs/42/ckpt-500/model.safetensors","ts":1.5}',
    '{"event":"done","rank":0,"steps":1000,"loss":0.0123,"seconds":3.21,"ts":1764680003.0}',
    '{"event":"error","rank":1,"kind":"comm","message":"rank 0 closed the connection during allreduce of bucket 2","ts":2.0}',
    '{"event":"state","state":"failed","error":"server restarted","job":42,"attempt":1,"seq":7,"ts":3.0}',
    '{"event":"loss","rank":0,"step":1,"epoch":0,"loss":1e308,"samples_per_s":0,"ts":0,"job":1,"attempt":1,"seq":1}',
]
for i, e in enumerate(events):
    put("event", f"event{i}.json", e)

# ---- npy (numpy.save)
def npy(a):
    b = io.BytesIO()
    np.save(b, a, allow_pickle=False)
    return b.getvalue()

rng = np.random.default_rng(0)
put("npy", "f32_5x3.npy", npy(rng.standard_normal((5, 3)).astype(np.float32)))
put("npy", "f64_4x3.npy", npy(rng.standard_normal((4, 3))))
put("npy", "i64_labels4.npy", npy(np.array([0, 2, 1, 2], np.int64)))
put("npy", "i32_labels4.npy", npy(np.array([1, 0, 2, 0], np.int32)))
put("npy", "f32_fortran.npy", npy(np.asfortranarray(rng.standard_normal((3, 3)).astype(np.float32))))
put("npy", "f32_bigendian.npy", npy(rng.standard_normal((2, 3)).astype(">f4")))
put("npy", "f32_empty.npy", npy(np.zeros((0, 3), np.float32)))
v2 = bytearray(npy(np.ones((2, 3), np.float32)))  # the same array as format 2.0 (4-byte header length)
hl = struct.unpack("<H", v2[8:10])[0]
put("npy", "f32_v2.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", hl) + bytes(v2[10:10 + hl])
    + bytes(v2[10 + hl:]))

# ---- csv
put("csv", "plain.csv", "a,b,y\n1,2,0\n3,4,1\n5,6,2\n-1.5e3,0.25,1\n")
put("csv", "crlf_bom_quoted.csv", "\ufeff\"a\",\"b\",\"y\"\r\n\" 1 \",2,0\r\n3,\"4\",1\r\n")
put("csv", "nan_inf.csv", "y,a,b\n0,nan,inf\n1,-inf,1e-30\n")
put("csv", "quoted_comma.csv", "\"a,1\",\"b\"\"q\",y\n1,2,2\n")

# ---- safetensors (CONTRACT.md §4)
def st(tensors, meta=None):
    hdr, data = {}, b""
    if meta:
        hdr["__metadata__"] = meta
    for name, (dtype, t) in tensors.items():
        raw = t.contiguous().numpy().tobytes() if dtype != "BF16" else t.view(torch.int16).numpy().tobytes()
        hdr[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data

torch.manual_seed(0)
lin = torch.nn.Linear(3, 2)
put("safetensors", "linear.safetensors",
    st({"0.weight": ("F32", lin.weight.detach()), "0.bias": ("F32", lin.bias.detach())}, {"step": "7"}))
put("safetensors", "dtypes.safetensors",
    st({"a": ("F64", torch.randn(2, 2, dtype=torch.float64)), "b": ("F16", torch.randn(3, dtype=torch.float16)),
        "c": ("BF16", torch.randn(2, 1, 2, dtype=torch.bfloat16)), "d": ("F32", torch.zeros(0, 4))}))
put("safetensors", "optim.safetensors",
    st({"0.weight.exp_avg": ("F32", torch.randn(2, 3)), "0.weight.exp_avg_sq": ("F32", torch.rand(2, 3))},
       {"step": "10", "epoch": "1", "epoch_step": "3"}))

# A tiny Hugging Face GPT-2 (fuzz_safetensors.c's GPT2_SPEC: 1 block, dim 4, 2 heads,
# vocabulary 5, 3 positions) with its mask buffer, and its config.json.
def gpt2_seed():
    g = torch.Generator().manual_seed(1)
    def r(*shape):
        return ("F32", torch.randn(*shape, generator=g))
    t = {"transformer.wte.weight": r(5, 4), "transformer.wpe.weight": r(3, 4),
         "transformer.h.0.attn.bias": ("F32", torch.tril(torch.ones(3, 3)).view(1, 1, 3, 3))}
    for name, shape in (("ln_1.weight", (4,)), ("ln_1.bias", (4,)), ("attn.c_attn.weight", (4, 12)),
                        ("attn.c_attn.bias", (12,)), ("attn.c_proj.weight", (4, 4)), ("attn.c_proj.bias", (4,)),
                        ("ln_2.weight", (4,)), ("ln_2.bias", (4,)), ("mlp.c_fc.weight", (4, 16)),
                        ("mlp.c_fc.bias", (16,)), ("mlp.c_proj.weight", (16, 4)), ("mlp.c_proj.bias", (4,))):
        t["transformer.h.0." + name] = r(*shape)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = r(4), r(4)
    return st(t, {"format": "pt"})


GPT2_CONFIG = json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                          "activation_function": "gelu_new", "n_layer": 1, "n_head": 2, "n_embd": 4,
                          "vocab_size": 5, "n_positions": 3, "n_ctx": 3, "n_inner": None,
                          "layer_norm_epsilon": 1e-05, "scale_attn_weights": True}, indent=2)
put("safetensors", "gpt2.safetensors", gpt2_seed())
put("safetensors", "gpt2-config.json", GPT2_CONFIG)

# ---- comm (worker/comm/cpu/wire.h; selector byte first). The proofs are HMAC-SHA256 under
# fuzz_comm.c's secret, over its nonce, as a rank of the right group would make them.
SECRET = b"ddpd-fuzz-key..\0"
NONCE = b"ddpd-fuzz-nonce-0123456789abcde\0"
def be32(v): return struct.pack(">I", v)
def addr4(port, ip=(127, 0, 0, 1)): return struct.pack(">HH", 4, port) + bytes(ip) + bytes(12)
def addr6(port): return struct.pack(">HH", 6, port) + bytes(15) + b"\x01"
def mac(msg): return hmac.new(SECRET, msg, hashlib.sha256).digest()
body = be32(2) + be32(1) + be32(2) + addr4(40001)
put("comm", "0_registration", b"\x00" + body + mac(b"ddpd cpu registration\0" + NONCE + body))
table = addr4(40000) + addr6(40001) + addr4(40002)
put("comm", "1_root_stream", b"\x01" + struct.pack(">H", 2) + be32(1) + be32(8) + be32(2) + be32(3)
    + be32(3) + be32(len(table)) + table)
put("comm", "1_root_error", b"\x01" + struct.pack(">H", 1) + be32(2) + be32(24) + b"world size mismatch\x07abc")
notice = b"rank 1 failed: out of memory"
put("comm", "2_notice", b"\x02\x03" + b"\0\0" + be32(0x4444504E) + be32(2) + be32(len(notice)) + notice)
nonce1 = bytes(range(32))
put("comm", "3_hello", b"\x03" + be32(0x44445048) + be32(2) + be32(1) + be32(4) + nonce1
    + mac(b"ddpd cpu ring connector\0" + be32(1) + be32(2) + be32(4) + nonce1 + NONCE))
put("comm", "4_shm_offer", b"\x04" + be32(0x53484D4F) + be32(1234) + be32(5) + be32(2 << 20) + bytes(range(16)))
put("comm", "5_header", b"\x05" + be32(0x44445043) + be32(1) + be32(0) + be32(7) + struct.pack(">Q", 4096))
idb = SECRET + addr4(43211) + bytes(128 - 36)
put("comm", "6_id_bytes", b"\x06" + idb)
put("comm", "6_id_hex", b"\x06" + idb.hex().encode())
put("comm", "7_challenge", b"\x07" + be32(0x44445043) + be32(2) + NONCE)

# ---- http (as curl sends them)
sj = json.dumps(json.loads(seed), separators=(",", ":"))
put("http", "post_job", f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    f"Content-Length: {len(sj)}\r\n\r\n{sj}")
put("http", "list", "GET /v1/jobs?state=running,queued&limit=20&before=17 HTTP/1.1\r\nHost: x\r\n\r\n")
put("http", "events", "GET /v1/jobs/42/events?format=ndjson&after=3 HTTP/1.1\r\nLast-Event-ID: 5\r\n\r\n")
put("http", "logs", "GET /v1/jobs/7/logs?rank=1&tail=50 HTTP/1.1\r\n\r\n")
put("http", "metrics", "GET /v1/jobs/7/metrics?max_points=100 HTTP/1.1\r\n\r\n")
put("http", "cancel", "POST /v1/jobs/9223372036854775807/cancel HTTP/1.1\r\n\r\n")
put("http", "delete", "DELETE /v1/jobs/1 HTTP/1.1\r\n\r\n")
put("http", "head_web", "HEAD /web/app.js HTTP/1.1\r\n\r\n")
put("http", "bad_json", "POST /v1/jobs HTTP/1.1\r\n\r\n{\"name\": \"a\",\n \"name\": 1}")
put("http", "escaped", "GET /v1/jobs/%31%32?limit=%2D1&state=%72unning HTTP/1.1\r\n\r\n")
put("http", "put_405", "PUT /v1/jobs HTTP/1.1\r\n\r\n")

# ---- pull (what a server sends the client commands: a checkpoint download, text)
hdr = json.dumps({"__metadata__": {"format": "pt"},
                  "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}}).encode()
put("pull", "checkpoint.safetensors", struct.pack("<Q", len(hdr)) + hdr + bytes(24))
put("pull", "error.json", b'{"error":{"code":"spec","path":"name","message":"job \x1b[2J\x1b]0;title\x07 '
    b'\xc2\x9b31m \xff done"}}\n')
put("pull", "log.txt", b'step 1 loss 0.5\n\tdata "a\x1bb.npy"\r\n\x7f\xe6\x97\xa5\xf0\x9f\x98\x80\xed\xa0\x80\xc0\xaf')
