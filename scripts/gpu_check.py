#!/usr/bin/env python3
"""The GPU check's stages: one run, one JSON report (`scripts/gpu-check.sh run` calls this).

Usage: gpu_check.py BUNDLE_DIR REPORT_JSON DEVICE [--quick]
       gpu_check.py --helper NAME ARGS_JSON   (a measurement run in a child process)

Runs on the lent GPU machine (python3 with torch and transformers, no Rust, no network) from
the bundle `scripts/gpu-check.sh bundle` wrote. Each stage has its own time budget, its own
entry in the report (status ok / failed / skipped, error text, seconds) and runs its
programs with a timeout, so one failing stage never loses the others; the report is
rewritten after every stage, so a run killed from outside keeps what it finished. Stages
that have a goal or a correctness criterion also carry a verdict (pass / fail) apart from
their status: `ok` says the stage ran and measured, the verdict says what it found. A stage
made of several measurements lists each under `parts` with its own status (ok / failed /
skipped, with the reason: not on a CPU, not in the time left); one failed part fails the
stage, a skipped one does not.

The run exits 0 when every stage is ok, or skipped only because it needs CUDA and this is a
CPU run; 1 otherwise.

--quick shrinks every stage (fewer samples, the tiny demo preset, a small stand-in for the
1B shape) for a dry run on a CPU (`GPU_DEVICE=cpu scripts/gpu-check.sh run --quick`).
"""

import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

# Seconds each stage may take on the GPU. Their sum plus the environment stays under
# TOTAL_BUDGET_S, which keeps the whole run (python and CUDA start-up included) within
# the 8 minutes one device run is given.
TOTAL_BUDGET_S = float(os.environ.get("GPU_CHECK_BUDGET_S", 460))
# None has been timed on a GPU yet: these are estimates from the CPU runs and the models'
# sizes. generate_1b and the attention variants of llama1b came out of the other stages'
# earlier shares (issue 38 item 5 asks for them in the same run).
BUDGETS_S = {
    "environment": 10,
    "parity": 40,
    "llama1b": 60,
    "generate_1b": 90,
    "roles": 50,
    "distributions": 40,
    "demo_train": 110,
    "demo_bench": 60,
}
# The demo's training time on the GPU, in minutes: 90% of it trains the two models; the
# tokenizer, tokenizing, timing two steps of each model and the evaluation come on top
# (62 s on 2 busy CPU cores with one training step each; less with 16), which demo_train's
# budget leaves room for.
DEMO_MINUTES = 1.0

# Llama-3.2-1B's config.json sizes, for the random checkpoint transformers writes and both
# transformers and specd generate with. The quick run's stand-in keeps the head layout
# (grouped queries, tied embeddings, llama3 RoPE) at a size 2 CPU cores run in seconds.
LLAMA_1B = {
    "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "tie_word_embeddings": True,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
}
LLAMA_1B_QUICK = {**LLAMA_1B, "vocab_size": 8192, "hidden_size": 128, "intermediate_size": 256,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
# The bucket the llama1b stage sets explicitly; the model crate's `auto` on CUDA
# (CUDA_KEY_BUCKET) is 256 too, and the stage skips a variant that resolves like `auto`.
ATTENTION_BUCKET = "256"

# The fixtures' shared tokenizer was trained on these sentences (scripts/make_fixtures.py):
# prompts made of their words encode without unknown bytes.
FIXTURE_WORDS = (
    "the quick brown fox jumps over the lazy dog "
    "speculative decoding proposes tokens with a draft model and verifies them "
    "a target model scores a whole block in one forward pass "
    "rollback keeps the key value cache consistent with the accepted prefix"
).split()
# The three roles run on this fixture (96 ids, 64 positions) as both target (bf16 on the
# device) and draft (f32): random fixtures are unrelated to one another (α near 0, so a
# speculative run would be target-only decoding in all but name), while one checkpoint in
# two dtypes agrees on most tokens and not on all, so blocks are accepted, verified in one
# pass and now and then rejected: both the accept and the residual paths run.
ROLE_MODEL = "llama_gqa_untied"
AUDIT_PROMPT = [1, 17, 5]
AUDIT_TEMPERATURE = 0.3
# Short Python prompts for the quick run's tiny demo pair, whose context is 64 tokens.
QUICK_DEMO_PROMPTS = ["def f(x):", "import os", "class A:", "for i in range(10):"]


class StageError(Exception):
    """A stage failed for a reason worth one line in the report; `result` keeps what it
    measured before (a stage of parts, one of which failed)."""

    def __init__(self, message, result=None):
        super().__init__(message)
        self.result = result


class StageSkipped(Exception):
    """A stage cannot run here (what it needs is missing); not a failure of its own.
    `cuda_only`: what is missing is a GPU, which a CPU dry run does not fail on."""

    def __init__(self, message, cuda_only=False):
        super().__init__(message)
        self.cuda_only = cuda_only


class Parts:
    """A stage's measurements, each with its own entry, so that one failing or left out for
    lack of time keeps the others. The order the stage asks them in is their priority: what
    decides the next step comes first, and what does not fit in the stage's time is skipped
    with the seconds it had."""

    def __init__(self, run):
        self.run = run
        self.entries = {}

    def do(self, name, fn, need_s=0.0, cuda_only=False):
        """Runs `fn()` as part `name` unless it needs CUDA on a CPU run or more than the
        `need_s` seconds (a GPU estimate) that are left; returns its result or None."""
        entry = {"status": "skipped", "seconds": 0.0}
        self.entries[name] = entry
        if cuda_only and not self.run.on_gpu:
            entry["reason"] = "needs CUDA; this is a CPU run"
            return None
        left = self.run.remaining()
        if left < need_s:
            entry["reason"] = f"not in the time left: {left:.0f} s of the stage, about {need_s:.0f} s needed"
            return None
        started = time.monotonic()
        print(f"gpu-check:   {name}…", file=sys.stderr, flush=True)
        try:
            entry["result"] = fn()
            entry["status"] = "ok"
        except StageSkipped as e:
            entry["reason"] = str(e)
        except StageError as e:
            entry["status"] = "failed"
            entry["error"] = str(e)
        except Exception as e:  # one broken measurement must not lose the stage's others
            entry["status"] = "failed"
            entry["error"] = f"{type(e).__name__}: {e}\n{tail(traceback.format_exc())}"
        entry["seconds"] = round(time.monotonic() - started, 1)
        return entry.get("result")

    def skip(self, name, reason):
        self.entries[name] = {"status": "skipped", "seconds": 0.0, "reason": reason}

    def result(self, name):
        return (self.entries.get(name) or {}).get("result")

    def finish(self, result):
        """`result` with the parts in it; a failed part fails the stage, keeping the rest."""
        result["parts"] = self.entries
        failed = [n for n, e in self.entries.items() if e["status"] == "failed"]
        if failed:
            first = self.entries[failed[0]]["error"].splitlines()[0]
            raise StageError(f"failed: {', '.join(failed)} ({failed[0]}: {first})", result=result)
        return result


class Run:
    """What every stage shares: the bundle, the device, the clock and the report."""

    def __init__(self, bundle, report_path, device, quick):
        self.bundle = bundle
        self.report_path = report_path
        self.device = device
        self.quick = quick
        self.on_gpu = device.startswith("cuda")
        self.specd = os.path.join(bundle, "specd")
        self.fixtures = os.path.join(bundle, "fixtures")
        self.work = tempfile.mkdtemp(prefix="gpu-check-")
        self.started = time.monotonic()
        self.deadline = None
        self.children = []
        self.helps = {}
        self.report = {
            "schema": 1,
            "device": device,
            "quick": quick,
            "budget_s": TOTAL_BUDGET_S,
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "bundle": read_json(os.path.join(bundle, "bundle.json")),
            "stages": {},
        }

    def elapsed(self):
        return time.monotonic() - self.started

    def remaining(self):
        """Seconds left to the current stage."""
        return max(0.0, self.deadline - time.monotonic())

    def write(self):
        self.report["seconds"] = round(self.elapsed(), 1)
        tmp = self.report_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.report, f, indent=1, sort_keys=False)
            f.write("\n")
        os.replace(tmp, self.report_path)

    def run(self, args, env=None, check=True, timeout=None):
        """Runs a program to its end within the stage's time; returns (code, stdout, stderr)."""
        limit = self.remaining() if timeout is None else min(timeout, self.remaining())
        if limit <= 1:
            raise StageError(f"no time left in the stage for {os.path.basename(args[0])}")
        full_env = {**os.environ, **(env or {})}
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=full_env, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            raise StageError(f"{' '.join(args[:3])} … timed out after {limit:.0f} s; stderr: {tail(err)}")
        except BaseException:
            kill_group(proc)
            raise
        if check and proc.returncode != 0:
            raise StageError(f"{' '.join(args[:3])} … exited with {proc.returncode}: {tail(err)}")
        return proc.returncode, out, err

    def json_of(self, args, env=None, check=True, timeout=None):
        """Runs a program that prints one JSON object; returns it (and the exit code)."""
        code, out, err = self.run(args, env=env, check=check, timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if not lines:
            raise StageError(f"{' '.join(args[:3])} … printed no JSON (exit {code}): {tail(err)}")
        return json.loads(lines[-1]), code, err

    def helper(self, name, args, timeout=None):
        """Runs `gpu_check.py --helper NAME` in a child python, which prints one JSON object a
        line as it measures: returns them all, and whether it ran out of time (a child can be
        stopped where an import or a compile in this process could not)."""
        limit = self.remaining() if timeout is None else min(timeout, self.remaining())
        if limit <= 1:
            raise StageError(f"no time left in the stage for helper {name}")
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--helper", name, json.dumps(args)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        timed_out = False
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
            timed_out = True
        except BaseException:
            kill_group(proc)
            raise
        docs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if not timed_out and proc.returncode != 0:
            raise StageError(f"helper {name} exited with {proc.returncode}: {tail(err)}")
        return docs, timed_out, limit

    def has_flag(self, subcommand, flag):
        """Whether this bundle's `specd SUBCOMMAND` takes `flag` (some of the flags the stages
        use come with work still landing: a bundle without one runs without it)."""
        if subcommand not in self.helps:
            _, out, err = self.run([self.specd, subcommand, "--help"], check=False, timeout=10)
            self.helps[subcommand] = out + err
        return flag in self.helps[subcommand].split()

    def draft_on_target_device(self):
        """`--draft-device` set to the target's, where the binary has the flag: the roles'
        stages test one checkpoint on one device in two dtypes, not a placement (with a CUDA
        target a small draft would otherwise go to the CPU host engine)."""
        return ["--draft-device", self.device] if self.has_flag("up", "--draft-device") else []

    def start_up(self, extra, log_name):
        """Starts `specd up` on a free port with the fixture pair; returns (process, URL)."""
        port = free_port()
        log = open(os.path.join(self.work, log_name), "w+")
        args = [
            self.specd, "up",
            "--target-model", os.path.join(self.fixtures, ROLE_MODEL),
            "--draft-model", os.path.join(self.fixtures, ROLE_MODEL),
            "--listen", f"127.0.0.1:{port}",
            "--device", self.device, "--dtype", "bf16", "--draft-dtype", "f32",
        ] + self.draft_on_target_device() + self.kv_flags() + extra
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.children.append(proc)
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise StageError(f"specd up exited with {proc.returncode}: {tail(log.read())}")
            if self.remaining() < 2:
                raise StageError("specd up did not start listening in time")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return proc, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(0.2)

    def kv_flags(self):
        """The KV budget flag a node needs here: none where the default (a fraction of the
        free memory) can be read, which on CUDA takes nvidia-smi; else a fixed budget."""
        if self.on_gpu and not shutil.which("nvidia-smi"):
            return ["--kv-budget-mib", "8192"]
        return []

    def stop(self, proc):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                proc.wait()


def kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tail(text, n=1500):
    text = (text or "").strip()
    return text if len(text) <= n else "…" + text[-n:]


def read_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def fixture_dirs(run):
    names = sorted(
        d for d in os.listdir(run.fixtures)
        if os.path.isfile(os.path.join(run.fixtures, d, "reference.json"))
    )
    if not names:
        raise StageError(f"no fixtures with reference.json under {run.fixtures}")
    return names


# ---------------------------------------------------------------------------------------
# Stages: each returns its result (a dict); raising StageError or anything else fails it.


def stage_environment(run):
    import torch
    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_devices": torch.cuda.device_count(),
        "cpu_cores": os.cpu_count(),
        # The bundle's binaries were linked here against glibc 2.34 and libstdc++ 3.4.29
        # symbols at most (the report's first line of trouble if they do not load there).
        "libc": " ".join(platform.libc_ver()),
        "host": platform.node(),
    }
    try:
        import transformers
        env["transformers"] = transformers.__version__
    except ImportError as e:
        env["transformers"] = f"missing: {e}"
    if torch.cuda.is_available():
        env["torch_gpu_name"] = torch.cuda.get_device_name(0)
        env["cuda_capability"] = ".".join(map(str, torch.cuda.get_device_capability(0)))
        # Whether transformers' and the probe's SDPA may pick cuDNN's kernel at all.
        env["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()
    if shutil.which("nvidia-smi"):
        code, out, _ = run.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            check=False, timeout=10)
        env["nvidia_smi"] = out.strip() if code == 0 else f"exit {code}"
    else:
        env["nvidia_smi"] = "absent"
    code, out, err = run.run([run.specd, "--version"], check=False, timeout=10)
    env["specd"] = out.strip() or tail(err)
    return env


# Tolerances of specd against transformers on the same device. f32: both run the same
# libtorch kernels in different orders; ~1e-5 is typical, 1e-3 leaves room for GPU
# reductions. bf16 keeps 8 significant bits (relative step 2^-8 ≈ 0.4%): rounding at each of
# a layer's dozen ops compounds, so the bound is relative to the logits' own scale.
PARITY_TOL = {"f32": (1e-3, 0.0), "bf16": (0.05, 0.02)}


def transformers_logits(dirs, tokens_of, device, dtype_name):
    import torch
    import transformers
    transformers.logging.disable_progress_bar()
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    out = {}
    for d in dirs:
        model = transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()
        ids = torch.tensor([tokens_of[d]], device=device)
        with torch.no_grad():
            out[d] = model(input_ids=ids).logits[0].float().cpu().tolist()
        del model
    return out


def compare(ours, ref, dtype_name):
    abs_tol, rel_tol = PARITY_TOL[dtype_name]
    if len(ours) != len(ref):
        raise StageError(f"{len(ours)} rows against transformers' {len(ref)}")
    scale = max(abs(x) for row in ref for x in row)
    tol = abs_tol + rel_tol * scale
    diff = max(abs(a - b) for r, s in zip(ours, ref) for a, b in zip(r, s))
    agree, ties = 0, 0
    for r, s in zip(ours, ref):
        mine, theirs = r.index(max(r)), s.index(max(s))
        if mine == theirs:
            agree += 1
        elif s[theirs] - s[mine] <= tol:
            # A near-tie in the reference: within the tolerance either token may win.
            ties += 1
    rows = len(ref)
    return {
        "positions": rows,
        "max_abs_diff": diff,
        "max_abs_logit": scale,
        "tolerance": tol,
        "argmax_agreement": agree / rows,
        "argmax_flips_at_near_ties": ties,
        "pass": diff <= tol and agree + ties == rows,
    }


def stage_parity(run):
    names = fixture_dirs(run)
    dirs = [os.path.join(run.fixtures, n) for n in names]
    tokens_of = {d: read_json(os.path.join(d, "reference.json"))["tokens"] for d in dirs}
    dtypes = ["f32", "bf16"]

    # The libtorch engine, which `auto` picks on a GPU: on a CPU dry run `auto` picks the host
    # engine, whose bf16 keeps activations in f32 (but for its linear layers' inputs on a CPU
    # with bf16 instructions) and so stands up to 0.7 from transformers' bf16 on the Gemma 3
    # fixtures where libtorch's equals it.
    def score(job):
        d, dtype = job
        doc, _, _ = run.json_of([
            run.specd, "logits", "--model", d, "--tokens", ",".join(map(str, tokens_of[d])),
            "--device", run.device, "--dtype", dtype, "--engine", "libtorch", "--json",
        ])
        return job, doc["logits"]

    # specd's processes run beside transformers, which scores in this process.
    with ThreadPoolExecutor(max_workers=4 if run.on_gpu else 2) as pool:
        pending = pool.map(score, [(d, t) for t in dtypes for d in dirs])
        reference = {t: transformers_logits(dirs, tokens_of, run.device, t) for t in dtypes}
        ours = dict(pending)
    result = {"tokens": len(next(iter(tokens_of.values()))), "tolerance_rule": {
        t: f"max |Δlogit| <= {a} + {r} × max |logit|; argmax equal unless the reference's margin is within that"
        for t, (a, r) in PARITY_TOL.items()}, "fixtures": {}}
    for name, d in zip(names, dirs):
        result["fixtures"][name] = {t: compare(ours[(d, t)], reference[t][d], t) for t in dtypes}
    failed = [f"{n} {t}" for n, r in result["fixtures"].items() for t, c in r.items() if not c["pass"]]
    result["verdict"] = "fail" if failed else "pass"
    result["failed"] = failed
    return result


def stage_llama1b(run):
    """The bench binary once per attention setting, each in its own process (a cuDNN plan
    cache warmed by one setting must not serve another), the default first and with the most
    samples; then the same question asked of torch itself, below specd."""
    base = {
        "SPECD_BENCH_DEVICE": run.device,
        "SPECD_BENCH_DTYPE": "bf16" if run.on_gpu else "f32",
        "SPECD_BENCH_SHAPE": "small" if run.quick else "1b",
        "SPECD_BENCH_DECODE_STEPS": "8" if run.quick else "64",
        "SPECD_BENCH_LENGTH_STEPS": "16" if run.quick else "64",
        "SPECD_BENCH_CONTEXT": "64" if run.quick else "512",
    }
    parts = Parts(run)

    def bench(keys, kernel, samples):
        env = {**base, "SPECD_BENCH_ATTENTION_KEYS": keys, "SPECD_BENCH_ATTENTION_KERNEL": kernel,
               "SPECD_BENCH_SAMPLES": samples}
        doc, _, _ = run.json_of([os.path.join(run.bundle, "llama1b_shape")], env=env)
        return doc

    full, few = ("5", "3") if run.quick else ("21", "7")
    default = parts.do("auto/auto", lambda: bench("auto", "auto", full), need_s=20)
    resolved = None
    if default and "attention" in default:
        resolved = (default["attention"].get("bucket_tokens"), default["attention"].get("kernel_resolved"))
    # Bucketed against exact keys is the plan-build question; efficient against sdpa is the
    # cuDNN one (sdpa lets libtorch pick cuDNN on sm90, efficient never does).
    for keys, kernel in (("exact", "sdpa"), (ATTENTION_BUCKET, "sdpa"), ("exact", "efficient"),
                         (ATTENTION_BUCKET, "efficient")):
        name = f"{keys}/{kernel}"
        bucket = None if keys == "exact" else int(keys)
        if resolved == (bucket, kernel):
            parts.skip(name, "auto/auto resolved to this setting on this device")
            continue
        parts.do(name, lambda k=keys, n=kernel: bench(k, n, few), need_s=12, cuda_only=kernel == "efficient")
    parts.do("torch_sdpa_probe", lambda: sdpa_probe(run), need_s=8, cuda_only=True)

    variants = {}
    for name, entry in parts.entries.items():
        doc = entry.get("result")
        if not doc or "decode_key_lengths" not in doc:
            continue
        lengths = doc["decode_key_lengths"]
        variants[name] = {
            "decode_1_ms_median": doc["decode_1_ms_median"],
            "verify_6_over_decode_1": doc["verify_over_decode"]["verify_6"]["ratio"],
            "repeated_length_decode_ms": lengths["repeated"]["median_ms"],
            "growing_length_decode_ms": lengths["growing"]["median_ms"],
            "growing_minus_repeated_mean_ms": lengths["gap_mean_ms"],
            "growing_steps_over_twice_the_repeated_median": lengths["growing_steps_over_twice_the_repeated_median"],
            "decode_tokens_per_s": doc["decode_tokens_per_s"],
            "attention": doc.get("attention"),
        }
    result = {
        "shape": (default or {}).get("shape"),
        "dtype": (default or {}).get("dtype"),
        "reading": "growing_minus_repeated_mean_ms is what a new key length costs a decode step (a "
                   "plan built per shape); exact against bucketed keys shows whether buckets remove "
                   "it, sdpa against efficient what cuDNN's kernel gives or costs",
        "variants": variants,
        "goal": "verify_6 / decode_1 <= 1.2 on the 1B shape in bf16 on the GPU (auto/auto)",
    }
    if default:
        result["default"] = default
        result["verdict"] = goal_verdict(run, default["verify_over_decode"]["verify_6"]["ratio"] <= 1.2)
    return parts.finish(result)


def sdpa_probe(run):
    docs, timed_out, limit = run.helper("sdpa_probe", {"device": run.device}, timeout=60)
    if timed_out or not docs:
        raise StageError(f"the SDPA probe gave no result in {limit:.0f} s")
    return docs[-1]


def goal_verdict(run, met):
    """A performance goal is the GPU's: a quick or CPU run has no verdict on it."""
    if run.quick or not run.on_gpu:
        return "not applicable (quick or CPU run)"
    return "pass" if met else "fail"


def id_prompts(shape, count, length):
    """`count` prompts of `length` ids spread over the vocabulary, the same for transformers
    (as ids) and for specd (as the word tokenizer's words, which encode to exactly these)."""
    v = shape["vocab_size"]
    return [[(7919 * i + 104729 * j + 1) % v for j in range(length)] for i in range(count)]


def stage_generate_1b(run):
    """transformers' own generation against specd's on one random checkpoint of the 1B shape,
    which transformers writes (bf16 safetensors, with a word tokenizer covering the whole
    vocabulary, so that text prompts are exactly the ids transformers gets).

    specd's speculative side proposes by prompt lookup (`--proposer ngram`): no trained draft
    shares this vocabulary, and a random draft would accept nothing. transformers' own prompt
    lookup is measured beside it."""
    shape = LLAMA_1B_QUICK if run.quick else LLAMA_1B
    count, length, new_tokens = (4, 16, 16) if run.quick else (4, 64, 128)
    prompts = id_prompts(shape, count, length)
    pair_dir = os.path.join(run.work, "llama1b")
    target = os.path.join(pair_dir, "target")
    compute = "bf16" if run.on_gpu else "f32"
    parts = Parts(run)
    hf = {}

    def eager():
        # Two prompts at batch 1 (equal lengths: the rate does not depend on which), all of
        # them twice over at batch 8, as specd's 8 clients send them.
        docs, timed_out, limit = run.helper("hf_1b", {
            "out": target, "shape": shape, "device": run.device, "dtype": compute, "seed": 7,
            "batch_1": [[p] for p in prompts[:2]], "batch_8": [(prompts * 2)[:8]], "new_tokens": new_tokens,
        })
        for d in docs:
            hf.update(d)
        if "checkpoint" not in hf:
            raise StageError(f"transformers wrote no checkpoint in {limit:.0f} s")
        if timed_out:
            raise StageError(f"transformers' generation did not finish in {limit:.0f} s; measured: {sorted(hf)}")
        return dict(hf)

    parts.do("transformers_eager", eager, need_s=40)

    def specd():
        if not os.path.isfile(os.path.join(target, "config.json")):
            raise StageSkipped("no checkpoint: transformers_eager did not write one")
        # `bench --embedded` reads a pair's directory; prompt lookup loads no draft model.
        draft = os.path.join(pair_dir, "draft")
        if not os.path.lexists(draft):
            os.symlink(target, draft)
        prompt_file = write_prompts(run, "llama1b-prompts.txt", [" ".join(f"t{i}" for i in p) for p in prompts])
        doc, _, _ = run.json_of([
            run.specd, "bench", "--embedded", "--demo-dir", pair_dir, "--device", run.device, "--dtype", compute,
            "--proposer", "ngram", "--temperature", "0", "--prompts", prompt_file,
            "--max-new-tokens", str(new_tokens), "--repeat", "1", "--concurrency", "8", "--json",
        ] + run.kv_flags())
        return doc

    bench = parts.do("specd", specd, need_s=30)

    def static():
        if not os.path.isfile(os.path.join(target, "config.json")):
            raise StageSkipped("no checkpoint: transformers_eager did not write one")
        # On a CPU, transformers compiles nothing by itself and inductor would take minutes
        # of a 2-core CI host: the static cache runs eager there, which still proves the
        # helper; on the GPU the compile gets whatever the stage has left.
        docs, timed_out, limit = run.helper("hf_static", {
            "model": target, "device": run.device, "dtype": compute, "prompts": prompts[:2],
            "new_tokens": new_tokens, "compile": run.on_gpu,
        })
        out = {}
        for d in docs:
            out.update(d)
        if "static_eager" not in out:
            raise StageError(f"the static cache measured nothing in {limit:.0f} s")
        if not run.on_gpu:
            out["compiled"] = {"status": "skipped", "reason": "a CPU run: transformers compiles only on a GPU, "
                                                              "and inductor would take minutes here"}
        elif timed_out and "compiled" not in out:
            out["compiled"] = {"status": "skipped", "reason": f"did not compile and measure within the "
                                                              f"{limit:.0f} s the stage had left"}
        return out

    static_doc = parts.do("transformers_static", static, need_s=20)

    def rate(doc, *path):
        for key in path:
            if not isinstance(doc, dict) or key not in doc:
                return None
            doc = doc[key]
        return doc

    b = bench or {}
    side = {
        "batch_1": {
            "transformers_eager": rate(hf, "eager_batch_1", "tokens_per_s"),
            "transformers_prompt_lookup": rate(hf, "prompt_lookup_batch_1", "tokens_per_s"),
            "transformers_static_cache": rate(static_doc, "static_eager", "tokens_per_s"),
            "transformers_static_cache_compiled": rate(static_doc, "compiled", "tokens_per_s"),
            "specd_target_only": rate(b, "target_only", "single_client_tokens_per_s"),
            "specd_speculative_ngram": rate(b, "speculative", "single_client_tokens_per_s"),
        },
        "batch_8": {
            "transformers_eager": rate(hf, "eager_batch_8", "tokens_per_s"),
            "specd_target_only": rate(b, "target_only", "aggregate_tokens_per_s"),
            "specd_speculative_ngram": rate(b, "speculative", "aggregate_tokens_per_s"),
        },
    }
    result = {
        "shape": "1b" if not run.quick else "quick stand-in",
        "config": shape,
        "dtype": compute,
        "prompts": count,
        "prompt_tokens": length,
        "new_tokens": new_tokens,
        "side_by_side_tokens_per_s": side,
        "specd_alpha_ngram": rate(b, "speculative", "alpha"),
        "goal": "specd target-only >= 1.2x transformers eager tokens/s at batch 1, on the GPU",
    }
    ours, theirs = side["batch_1"]["specd_target_only"], side["batch_1"]["transformers_eager"]
    if ours and theirs:
        result["specd_over_transformers_batch_1"] = ours / theirs
        result["verdict"] = goal_verdict(run, ours >= 1.2 * theirs)
    return parts.finish(result)


def role_prompts(n):
    """n distinct prompts of 4 to 8 of the fixture tokenizer's corpus words (read cyclically
    from a different word each)."""
    words, w = FIXTURE_WORDS, len(FIXTURE_WORDS)
    return [" ".join(words[(5 * i + j) % w] for j in range(4 + i % 5)) for i in range(n)]


def write_prompts(run, name, prompts):
    path = os.path.join(run.work, name)
    with open(path, "w") as f:
        f.write("\n---\n".join(prompts))
    return path


def stage_roles(run):
    prompts = write_prompts(run, "role-prompts.txt", role_prompts(20))
    # Prefixes of 16 tokens are kept (the default is 32): the fixture's conversations are
    # shorter than its 64 positions (prefix_cache_conversations).
    proc, url = run.start_up(["--prefix-cache-min-tokens", "16"], "roles-up.log")
    try:
        greedy, _, _ = run.json_of([
            run.specd, "bench", "--endpoint", url, "--prompts", prompts, "--temperature", "0",
            "--gamma", "4", "--repeat", "1", "--max-new-tokens", "8" if run.quick else "24", "--json",
        ])
        # Two-sample (speculative against target-only, both through the GPU's passes) over
        # the whole vocabulary: a truncation (top-k, top-p) would put a boundary where a bf16
        # near-tie scored in a block and in a one-token pass may fall on either side, which
        # an exact test against NextTokenLaw fails on for rounding alone, and without one
        # the exact law has 96³ continuations. T = 0.3 concentrates the law enough for the
        # χ² test to keep cells (at T = 1, 500 draws fell in 992 cells, every one pooled).
        # 5000 per arm: 22.6 s for both arms on 2 CPU cores here; a tiny model's passes cost
        # launches more than arithmetic, about as much on a GPU.
        samples = "1000" if run.quick else "5000"
        audit, code, err = run.json_of([
            run.specd, "audit", "--endpoint", url, "--token-ids", ",".join(map(str, AUDIT_PROMPT)),
            "--tokens", "3", "--samples", samples, "--temperature", str(AUDIT_TEMPERATURE),
            "--mode", "two-sample", "--gamma", "4", "--concurrency", "8", "--json",
        ], check=False)
        if code not in (0, 1):
            raise StageError(f"specd audit exited with {code}: {tail(err)}")
        # Its failure fails the stage's verdict, and keeps the greedy and audit results.
        try:
            chat = prefix_cache_conversations(run, url)
        except (StageError, KeyError, TypeError, ValueError) as err:
            chat = {"error": str(err), "pass": False}
    finally:
        run.stop(proc)
    agreement = greedy["greedy_agreement"]
    result = {
        "pair": {"target": ROLE_MODEL + " bf16", "draft": ROLE_MODEL + " f32", "device": run.device},
        "greedy_identity": {
            "prompts": agreement["pairs"],
            "identical_fraction": agreement["identical_fraction"],
            "common_prefix_fraction": agreement["common_prefix_fraction"],
            "max_new_tokens": greedy["max_new_tokens"],
            "pass": agreement["identical_fraction"] == 1.0,
        },
        "audit": {**audit, "prompt_ids": AUDIT_PROMPT, "temperature": AUDIT_TEMPERATURE, "gamma": 4},
        "wire_bytes_per_round": greedy["wire_bytes_per_round"],
        "wire_bytes_per_round_by_role": greedy["wire_bytes_per_round_by_role"],
        "greedy_bench": {k: greedy[k] for k in (
            "target_only_tokens_per_s", "speculative_tokens_per_s", "speedup", "alpha",
            "mean_tokens_per_round", "verify_pass_ms", "target_only_pass_ms", "draft_step_ms",
            "round_overhead_ms")},
    }
    result["prefix_cache"] = chat
    ok = result["greedy_identity"]["pass"] and audit.get("verdict") == "pass" and chat["pass"]
    result["verdict"] = "pass" if ok else "fail"
    return result


def prefix_cache_conversations(run, url):
    """The nodes' prefix caches on the device (issue 39): greedy conversations whose turns
    resend the ones before, through `specd bench --workload chat`. Both nodes must reuse
    most of each later turn's prompt, and every mode's conversations (speculative and
    target-only, cached and not) must read as the target alone without reuse. The fixture's
    tokenizer spends about 6 tokens on two words: its 64 positions hold the system prompt (one
    copy of the two user messages, 14 tokens) and three turns of a message and 4 new tokens."""
    prompts = write_prompts(run, "chat-prompts.txt", ["the quick", "lazy dog"])
    chat, _, _ = run.json_of([
        run.specd, "bench", "--endpoint", url, "--workload", "chat", "--prompts", prompts,
        "--system-tokens", "12", "--conversations", "2", "--turns", "3", "--max-new-tokens", "4",
        "--temperature", "0", "--gamma", "4", "--json",
    ])
    cached = chat["modes"]["speculative, cache reused"]
    same = chat["conversations_as_target_only_without_reuse"]
    result = {
        "system_prompt_tokens": chat["system_prompt_tokens"],
        "conversations": chat["conversations"],
        "turns": chat["turns"],
        "target_reused_after_first_turn": cached["target_reused_after_first_turn"],
        "draft_reused_after_first_turn": cached["draft_reused_after_first_turn"],
        "ttft_after_first_turn_cache_over_no_reuse": chat["speculative"]["ttft_after_first_turn_cache_over_no_reuse"],
        "conversations_as_target_only_without_reuse": same,
    }
    # Half of a later turn's prompt at least: what the turns before it hold, less the new
    # user message and the few tokens where the resent text tokenizes differently.
    reused = all((cached[k] or 0) >= 0.5 for k in ("target_reused_after_first_turn", "draft_reused_after_first_turn"))
    result["pass"] = reused and all(n == chat["conversations"] for n in same.values())
    return result


def generate_all(run, url, prompts, seed0):
    outputs = []
    for i, prompt in enumerate(prompts):
        doc, _, _ = run.json_of([
            run.specd, "generate", "--endpoint", url, "--prompt", prompt, "--temperature", "0.8",
            "--seed", str(seed0 + i), "--gamma", "4", "--max-new-tokens", "24", "--ignore-eos", "--json",
        ])
        outputs.append(doc.get("token_ids") or doc.get("tokenIds") or [])
    return outputs


def stage_distributions(run):
    prompts = role_prompts(4 if run.quick else 8)
    prompt_file = write_prompts(run, "distribution-prompts.txt", prompts)
    modes = {}
    for mode in ("host", "device"):
        proc, url = run.start_up(["--distributions", mode], f"distributions-{mode}-up.log")
        try:
            bench, _, _ = run.json_of([
                run.specd, "bench", "--endpoint", url, "--prompts", prompt_file, "--temperature", "0.8",
                "--gamma", "4", "--repeat", "1", "--max-new-tokens", "8" if run.quick else "32", "--json",
            ])
            outputs = generate_all(run, url, prompts, 1000)
        finally:
            run.stop(proc)
        modes[mode] = {
            "speculative_tokens_per_s": bench["speculative_tokens_per_s"],
            "target_only_tokens_per_s": bench["target_only_tokens_per_s"],
            "verify_pass_ms": bench["verify_pass_ms"],
            "target_only_pass_ms": bench["target_only_pass_ms"],
            "alpha": bench["alpha"],
            "outputs": outputs,
        }
    same = sum(a == b for a, b in zip(modes["host"]["outputs"], modes["device"]["outputs"]))
    for m in modes.values():
        m["outputs"] = len(m["outputs"])
    result = {
        "job": f"seeded, T = 0.8, γ = 4, {ROLE_MODEL}: target bf16, draft f32, --distributions on both",
        "modes": modes,
        "identical_outputs": same,
        "requests": len(prompts),
        "device_over_host_speculative": modes["device"]["speculative_tokens_per_s"]
        / modes["host"]["speculative_tokens_per_s"],
        # Seeded runs agree up to rounding: a draw within rounding of a bucket edge may
        # differ. Over 8 short requests that is unlikely enough that a difference fails the
        # stage, to be read in the outputs it reports.
        "verdict": "pass" if same == len(prompts) else "fail",
    }
    return result


def demo_dir(run):
    return os.path.join(run.work, "demo")


def stage_demo_train(run):
    args = [run.specd, "models", "demo", "--device", run.device, "--out", demo_dir(run), "--json"]
    args += ["--preset", "tiny"] if run.quick else ["--minutes", str(DEMO_MINUTES)]
    doc, _, err = run.json_of(args)
    doc["corpus"] = next((line for line in err.splitlines() if line.startswith("corpus:")), None)
    doc["steps"] = next((line for line in err.splitlines() if "--target-steps" in line), None)
    doc["log"] = tail(err, 3000)
    return doc


def read_prompts(path):
    """A prompts file as `specd bench --prompts` splits it (lines holding only `---`)."""
    with open(path) as f:
        chunks, current = [], []
        for line in f.read().split("\n"):
            if line.strip() == "---":
                chunks.append("\n".join(current))
                current = []
            else:
                current.append(line)
        chunks.append("\n".join(current))
    return [c for c in chunks if c.strip()]


def draft_placements(run):
    """(name, flags) of the demo draft's placements to measure, the default first: the CPU
    host engine beside the target (what `up` and `bench` pick for a small draft with a CUDA
    target), then the target's device."""
    if not run.has_flag("bench", "--draft-device"):
        return [("binary_default", [])]
    out = [("cpu", ["--draft-device", "cpu", "--draft-dtype", "f32"])]
    if run.on_gpu:
        out.append(("device", ["--draft-device", run.device]))
    return out


def bench_summary(doc):
    return {
        "speedup_median": doc["speedup"]["median"],
        "decode_speedup_median": doc["decode_speedup"]["median"],
        "alpha": doc["alpha"],
        "mean_gamma": doc["mean_gamma"],
        "bound": doc["bound"],
        "measured_over_bound": doc["efficiency"],
        "verify_cost_ratio": doc["verify_cost_ratio"],
        "draft_step_ms": doc["draft_step_ms"],
        "target_only_tokens_per_s": doc["target_only_tokens_per_s"],
        "speculative_tokens_per_s": doc["speculative_tokens_per_s"],
        "greedy_agreement": doc["greedy_agreement"],
        "full": doc,
    }


def stage_demo_bench(run):
    if not os.path.isfile(os.path.join(demo_dir(run), "target", "config.json")):
        raise StageSkipped("no demo pair: demo_train did not finish")
    if run.quick:
        prompts = QUICK_DEMO_PROMPTS
    else:
        # specd bench's built-in code prompts, carried as a file so that transformers gets the
        # same text.
        prompts = read_prompts(os.path.join(run.bundle, "bench_prompts.txt"))
    prompt_file = write_prompts(run, "demo-prompts.txt", prompts)
    new_tokens = "16" if run.quick else "128"
    dtype = "bf16" if run.on_gpu else "f32"
    # The quick run's tiny pair has α ≈ 0, where γ = auto drafts nothing: a fixed γ runs the
    # speculative path anyway.
    base = [run.specd, "bench", "--embedded", "--demo-dir", demo_dir(run), "--device", run.device,
            "--dtype", dtype, "--prompts", prompt_file, "--max-new-tokens", new_tokens, "--json"]
    base += (["--gamma", "3"] if run.quick else []) + run.kv_flags()
    placements = draft_placements(run)
    parts = Parts(run)

    def bench(temperature, repeat, flags):
        doc, _, _ = run.json_of(base + ["--temperature", temperature, "--repeat", repeat] + flags)
        return doc

    first, first_flags = placements[0]
    parts.do(f"specd_greedy_draft_{first}",
             lambda: bench_summary(bench("0", "1" if run.quick else "2", first_flags)), need_s=15)

    def transformers():
        docs, timed_out, limit = run.helper("hf_demo", {
            "target": os.path.join(demo_dir(run), "target"), "draft": os.path.join(demo_dir(run), "draft"),
            "device": run.device, "dtype": dtype, "prompts": prompts, "batch_1_prompts": 4,
            "new_tokens": int(new_tokens),
        })
        out = {}
        for d in docs:
            out.update(d)
        if timed_out:
            raise StageError(f"transformers did not finish in {limit:.0f} s; measured: {sorted(out)}")
        return out

    hf = parts.do("transformers", transformers, need_s=15)
    loaded = parts.do("specd_greedy_8_sessions", lambda: bench("0", "1", first_flags + ["--concurrency", "8"]),
                      need_s=15)
    for name, flags in placements[1:]:
        parts.do(f"specd_greedy_draft_{name}", lambda f=flags: bench_summary(bench("0", "1", f)), need_s=10)
    parts.do("specd_t0.8", lambda: bench_summary(bench("0.8", "1", first_flags)), need_s=10)

    greedy = {name: parts.result(f"specd_greedy_draft_{name}") for name, _ in placements}
    greedy = {k: v for k, v in greedy.items() if v}
    hf = hf or {}
    get = lambda d, k: (d or {}).get(k, {}).get("tokens_per_s")  # noqa: E731
    first_greedy = greedy.get(first) or {}
    side = {
        "batch_1": {
            "transformers_eager": get(hf, "eager_batch_1"),
            "transformers_assisted": get(hf, "assisted_batch_1"),
            "specd_target_only": first_greedy.get("target_only_tokens_per_s"),
            **{f"specd_speculative_draft_{k}": v["speculative_tokens_per_s"] for k, v in greedy.items()},
        },
        "batch_8": {
            "transformers_eager": get(hf, "eager_batch_8"),
            "specd_target_only": (loaded or {}).get("target_only", {}).get("aggregate_tokens_per_s"),
            "specd_speculative": (loaded or {}).get("speculative", {}).get("aggregate_tokens_per_s"),
        },
    }
    result = {
        "prompts": len(prompts),
        "new_tokens": int(new_tokens),
        "dtype": dtype,
        "draft_placements": [name for name, _ in placements],
        "side_by_side_tokens_per_s": side,
        "goal": "greedy speedup >= 2x and measured / bound >= 0.9, on the GPU, at the better draft placement",
    }
    if greedy:
        best = max(greedy, key=lambda k: greedy[k]["speedup_median"])
        g = greedy[best]
        result["best_placement"] = best
        result["verdict"] = goal_verdict(run, g["speedup_median"] >= 2.0 and g["measured_over_bound"] >= 0.9)
    return parts.finish(result)


# ---------------------------------------------------------------------------------------
# Helpers: measurements run in a child python (`--helper NAME ARGS_JSON`), each printing one
# JSON object a line as it goes, so that what finished survives a timeout.


def emit(doc):
    print(json.dumps(doc), flush=True)


def torch_dtype(name):
    import torch
    return {"f32": torch.float32, "bf16": torch.bfloat16}[name]


def sync(device):
    import torch
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def hf_inputs(batch, device):
    """Input ids and attention mask of a batch of id lists, padded on the left with id 0."""
    import torch
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(b)) + list(b) for b in batch], device=device)
    mask = torch.tensor([[0] * (width - len(b)) + [1] * len(b) for b in batch], device=device)
    return ids, mask


def hf_rate(model, batches, new_tokens, device, warm_tokens=4, **generate_kw):
    """Greedy `generate` over each batch in turn after one unmeasured call of `warm_tokens`
    (which is where a compile happens): new tokens per second, prompt passes included as in
    specd bench's request times."""
    import torch

    def generate(batch, n):
        ids, mask = hf_inputs(batch, device)
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                             do_sample=False, pad_token_id=0, **generate_kw)
        return (out.shape[1] - ids.shape[1]) * len(batch)

    with torch.inference_mode():
        sync(device)
        start = time.perf_counter()
        generate(batches[0], warm_tokens)
        sync(device)
        first = time.perf_counter() - start
        start = time.perf_counter()
        made = sum(generate(b, new_tokens) for b in batches)
        sync(device)
        seconds = time.perf_counter() - start
    return {"tokens_per_s": made / seconds, "new_tokens": made, "seconds": seconds, "batch": len(batches[0]),
            "calls": len(batches), "first_call_s": first, "attention": model.config._attn_implementation}


def word_tokenizer(path, vocab_size):
    """A tokenizer whose word `t<i>` is id i for the whole vocabulary: specd's text prompts
    then encode to exactly the ids transformers is given."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab_size)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(path)


def helper_hf_1b(a):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    device = a["device"]
    started = time.perf_counter()
    config = transformers.LlamaConfig(**a["shape"], bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(a["seed"])
    # Made on the device: 1.2 G parameters drawn on a CPU would take most of the stage.
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    os.makedirs(a["out"], exist_ok=True)
    model.save_pretrained(a["out"])
    word_tokenizer(os.path.join(a["out"], "tokenizer.json"), config.vocab_size)
    files = {n: os.path.getsize(os.path.join(a["out"], n)) for n in sorted(os.listdir(a["out"]))}
    emit({"checkpoint": {"parameters": sum(p.numel() for p in model.parameters()), "dtype": "bf16",
                         "files": files, "seconds": time.perf_counter() - started}})
    model = model.to(torch_dtype(a["dtype"]))
    n = a["new_tokens"]
    emit({"eager_batch_1": hf_rate(model, a["batch_1"], n, device)})
    emit({"eager_batch_8": hf_rate(model, a["batch_8"], n, device)})
    emit({"prompt_lookup_batch_1": hf_rate(model, a["batch_1"], n, device, prompt_lookup_num_tokens=10)})


def helper_hf_static(a):
    import torch
    import transformers
    transformers.logging.set_verbosity_error()
    device, n = a["device"], a["new_tokens"]
    model = transformers.AutoModelForCausalLM.from_pretrained(a["model"], dtype=torch_dtype(a["dtype"]))
    model = model.to(device).eval()
    batches = [[p] for p in a["prompts"]]
    emit({"static_eager": hf_rate(model, batches, n, device, cache_implementation="static", disable_compile=True)})
    if a["compile"]:
        # transformers compiles the decoding step by itself for a static cache on a GPU (CUDA
        # graphs, reduce-overhead); the first call, as long as the measured ones so that no
        # other cache shape is compiled for, is the compile.
        compiled = hf_rate(model, batches, n, device, warm_tokens=n, cache_implementation="static")
        # Whether transformers compiled at all: graphs dynamo captured (0: it ran eager).
        from torch._dynamo.utils import counters
        compiled["dynamo_unique_graphs"] = counters["stats"]["unique_graphs"]
        emit({"compiled": compiled})


def helper_hf_demo(a):
    import torch
    import transformers
    from tokenizers import Tokenizer
    transformers.logging.set_verbosity_error()
    device, n, dtype = a["device"], a["new_tokens"], torch_dtype(a["dtype"])
    load = lambda d: transformers.AutoModelForCausalLM.from_pretrained(d, dtype=dtype).to(device).eval()  # noqa: E731
    target, draft = load(a["target"]), load(a["draft"])
    tok = Tokenizer.from_file(os.path.join(a["target"], "tokenizer.json"))
    # With its special tokens, as specd's target node encodes a prompt.
    ids = [tok.encode(p).ids for p in a["prompts"]]
    ones = [[p] for p in ids[:a["batch_1_prompts"]]]
    emit({"eager_batch_1": hf_rate(target, ones, n, device)})
    emit({"eager_batch_8": hf_rate(target, [(ids * 8)[:8]], n, device)})
    emit({"assisted_batch_1": hf_rate(target, ones, n, device, assistant_model=draft)})


def helper_sdpa_probe(a):
    """torch's own attention at the decode shape of the 1B model (32 query heads, KV repeated
    to them, head 64, bf16), per backend: calls at one key length against calls at a new
    length each (key views of one larger buffer, as a KV cache's are). A backend that builds
    a plan per shape (cuDNN) shows it as the gap, with specd nowhere in the path."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    device, heads, dim, start, steps = a["device"], 32, 64, 512, 48
    torch.manual_seed(0)
    q = torch.randn(1, heads, 1, dim, device=device, dtype=torch.bfloat16)
    cache = torch.randn(2, 1, heads, start + steps + 8, dim, device=device, dtype=torch.bfloat16)
    out = {"shape": {"heads": heads, "head_dim": dim, "from_keys": start, "steps": steps}, "backends": {}}
    for name in ("CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "FLASH_ATTENTION", "MATH"):
        backend = getattr(SDPBackend, name, None)
        if backend is None:
            out["backends"][name] = {"error": "not in this torch"}
            continue

        def call(length):
            sync(device)
            t = time.perf_counter()
            F.scaled_dot_product_attention(q, cache[0, :, :, :length], cache[1, :, :, :length])
            sync(device)
            return (time.perf_counter() - t) * 1e3

        try:
            with sdpa_kernel([backend]), torch.inference_mode():
                for _ in range(3):
                    call(start)
                repeated = [call(start) for _ in range(steps)]
                growing = [call(start + 1 + i) for i in range(steps)]
        except RuntimeError as e:
            out["backends"][name] = {"error": str(e).splitlines()[0][:300]}
            continue
        med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
        out["backends"][name] = {
            "repeated_length_ms_median": med(repeated),
            "growing_length_ms_median": med(growing),
            "growing_minus_repeated_mean_ms": sum(growing) / steps - sum(repeated) / steps,
            "growing_max_ms": max(growing),
        }
    emit(out)


HELPERS = {
    "hf_1b": helper_hf_1b,
    "hf_static": helper_hf_static,
    "hf_demo": helper_hf_demo,
    "sdpa_probe": helper_sdpa_probe,
}


STAGES = [
    ("environment", stage_environment),
    ("parity", stage_parity),
    ("llama1b", stage_llama1b),
    ("generate_1b", stage_generate_1b),
    ("roles", stage_roles),
    ("distributions", stage_distributions),
    ("demo_train", stage_demo_train),
    ("demo_bench", stage_demo_bench),
]


def main():
    if sys.argv[1:2] == ["--helper"]:
        HELPERS[sys.argv[2]](json.loads(sys.argv[3]))
        return 0
    args = [a for a in sys.argv[1:] if a != "--quick"]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    bundle, report_path, device = args
    # A run stopped from outside (the shell's timeout) still writes its report and stops
    # what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = Run(os.path.abspath(bundle), report_path, device, "--quick" in sys.argv[1:])
    # The quick dry run on a CPU is slower per stage than the GPU run is: give it room, but
    # not so much that a hang holds `make test` for long (its stages took a third of these
    # budgets or less on 2 busy cores).
    scale = 1.5 if run.quick and not run.on_gpu else 1.0
    total = TOTAL_BUDGET_S * scale
    # Every stage is in the report from the start: one the run never reaches (stopped from
    # outside) still says so.
    for name, _ in STAGES:
        run.report["stages"][name] = {"status": "skipped", "budget_s": None, "seconds": 0.0,
                                      "error": "not reached: the run ended before it"}
    try:
        for name, fn in STAGES:
            budget = min(BUDGETS_S[name] * scale, total - run.elapsed())
            entry = {"status": "skipped", "budget_s": round(budget, 1), "seconds": 0.0, "error": None}
            run.report["stages"][name] = entry
            if budget < 5:
                entry["error"] = "no time left in the run's budget"
                run.write()
                continue
            print(f"gpu-check: {name} (budget {budget:.0f} s)…", file=sys.stderr, flush=True)
            run.deadline = time.monotonic() + budget
            started = time.monotonic()
            try:
                entry["result"] = fn(run)
                entry["status"] = "ok"
            except StageError as e:
                entry["status"] = "failed"
                entry["error"] = str(e)
                if e.result is not None:
                    entry["result"] = e.result
            except StageSkipped as e:
                entry["error"] = str(e)
                entry["cuda_only"] = e.cuda_only
            except Exception as e:  # a broken stage must not lose the others
                entry["status"] = "failed"
                entry["error"] = f"{type(e).__name__}: {e}\n{tail(traceback.format_exc())}"
            except BaseException:
                # Stopped from outside (SIGTERM from the shell's timeout, ^C): say so, and let
                # the report be written on the way out.
                entry["status"] = "failed"
                entry["error"] = f"stopped from outside after {time.monotonic() - started:.1f} s"
                entry["seconds"] = round(time.monotonic() - started, 1)
                raise
            finally:
                for child in run.children:
                    run.stop(child)
                run.children.clear()
            entry["seconds"] = round(time.monotonic() - started, 1)
            verdict = (entry.get("result") or {}).get("verdict") if isinstance(entry.get("result"), dict) else None
            print(f"gpu-check: {name}: {entry['status']}"
                  f"{', ' + verdict if verdict else ''} in {entry['seconds']} s"
                  f"{': ' + entry['error'].splitlines()[0] if entry['error'] else ''}",
                  file=sys.stderr, flush=True)
            run.write()
    finally:
        stages = run.report["stages"]
        run.report["summary"] = {name: summary_of(e) for name, e in stages.items()}
        run.report["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run.write()
        shutil.rmtree(run.work, ignore_errors=True)
    passed = all(e["status"] == "ok" or (e["status"] == "skipped" and e.get("cuda_only") and not run.on_gpu)
                 for e in run.report["stages"].values())
    return 0 if passed else 1


def summary_of(entry):
    """A stage's line of the summary: status, verdict, and what of it was skipped or failed."""
    result = entry.get("result") if isinstance(entry.get("result"), dict) else {}
    line = {"status": entry["status"], "verdict": result.get("verdict")}
    parts = result.get("parts") or {}
    for status in ("skipped", "failed"):
        named = {n: p.get("reason") or p.get("error", "").splitlines()[0]
                 for n, p in parts.items() if p["status"] == status}
        if named:
            line[f"parts_{status}"] = named
    if entry.get("error"):
        line["error"] = entry["error"].splitlines()[0]
    return line


if __name__ == "__main__":
    sys.exit(main())
