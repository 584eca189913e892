#!/usr/bin/env python3
"""The GPU check's stages: one run, one JSON report (`scripts/gpu-check.sh run` calls this).

Usage: gpu_check.py BUNDLE_DIR REPORT_JSON DEVICE [--quick]

Runs on the lent GPU machine (python3 with torch and transformers, no Rust, no network) from
the bundle `scripts/gpu-check.sh bundle` wrote. Each stage has its own time budget, its own
entry in the report (status ok / failed / skipped, error text, seconds) and runs its
programs with a timeout, so one failing stage never loses the others; the report is
rewritten after every stage, so a run killed from outside keeps what it finished. Stages
that have a goal or a correctness criterion also carry a verdict (pass / fail) apart from
their status: `ok` says the stage ran and measured, the verdict says what it found.

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
BUDGETS_S = {
    "environment": 15,
    "parity": 45,
    "llama1b": 40,
    "roles": 75,
    "distributions": 55,
    "demo_train": 150,
    "demo_bench": 70,
}
# The demo's training time on the GPU, in minutes: 90% of it trains the two models; the
# tokenizer, tokenizing, timing two steps of each model and the evaluation come on top
# (62 s on 2 busy CPU cores with one training step each), which demo_train's budget leaves
# room for.
DEMO_MINUTES = 1.6

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
    """A stage failed for a reason worth one line in the report."""


class StageSkipped(Exception):
    """A stage cannot run here (what it needs is missing); not a failure of its own."""


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
        ] + self.kv_flags() + extra
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

    def score(job):
        d, dtype = job
        doc, _, _ = run.json_of([
            run.specd, "logits", "--model", d, "--tokens", ",".join(map(str, tokens_of[d])),
            "--device", run.device, "--dtype", dtype, "--json",
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
    env = {
        "SPECD_BENCH_DEVICE": run.device,
        "SPECD_BENCH_DTYPE": "bf16" if run.on_gpu else "f32",
        "SPECD_BENCH_SHAPE": "small" if run.quick else "1b",
        "SPECD_BENCH_SAMPLES": "5" if run.quick else "21",
        "SPECD_BENCH_DECODE_STEPS": "8" if run.quick else "64",
        "SPECD_BENCH_CONTEXT": "64" if run.quick else "512",
    }
    doc, _, _ = run.json_of([os.path.join(run.bundle, "llama1b_shape")], env=env)
    ratio6 = doc["verify_over_decode"]["verify_6"]["ratio"]
    doc["goal"] = "verify_6 / decode_1 <= 1.2 on the 1B shape in bf16 on the GPU"
    doc["verdict"] = goal_verdict(run, ratio6 <= 1.2)
    return doc


def goal_verdict(run, met):
    """A performance goal is the GPU's: a quick or CPU run has no verdict on it."""
    if run.quick or not run.on_gpu:
        return "not applicable (quick or CPU run)"
    return "pass" if met else "fail"


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
    proc, url = run.start_up([], "roles-up.log")
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
            "mean_tokens_per_round", "verify_pass_ms", "target_only_pass_ms", "draft_step_ms")},
    }
    ok = result["greedy_identity"]["pass"] and audit.get("verdict") == "pass"
    result["verdict"] = "pass" if ok else "fail"
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


def stage_demo_bench(run):
    if not os.path.isfile(os.path.join(demo_dir(run), "target", "config.json")):
        raise StageSkipped("no demo pair: demo_train did not finish")
    out = {}
    # The quick run's tiny pair has α ≈ 0, where γ = auto drafts nothing: a fixed γ runs the
    # speculative path anyway.
    quick = ["--prompts", write_prompts(run, "demo-prompts.txt", QUICK_DEMO_PROMPTS), "--gamma", "3"]
    extra = (quick if run.quick else []) + run.kv_flags()
    for name, temperature in (("greedy", "0"), ("t0.8", "0.8")):
        doc, _, _ = run.json_of([
            run.specd, "bench", "--embedded", "--demo-dir", demo_dir(run), "--device", run.device,
            "--dtype", "bf16" if run.on_gpu else "f32", "--temperature", temperature,
            "--repeat", "1" if run.quick else "2", "--max-new-tokens", "16" if run.quick else "128", "--json",
        ] + extra)
        out[name] = {
            "speedup_median": doc["speedup"]["median"],
            "decode_speedup_median": doc["decode_speedup"]["median"],
            "alpha": doc["alpha"],
            "mean_gamma": doc["mean_gamma"],
            "bound": doc["bound"],
            "measured_over_bound": doc["efficiency"],
            "verify_cost_ratio": doc["verify_cost_ratio"],
            "target_only_tokens_per_s": doc["target_only_tokens_per_s"],
            "speculative_tokens_per_s": doc["speculative_tokens_per_s"],
            "greedy_agreement": doc["greedy_agreement"],
            "full": doc,
        }
    goals = out["greedy"]["speedup_median"] >= 2.0 and out["greedy"]["measured_over_bound"] >= 0.9
    out["goal"] = "greedy speedup >= 2x and measured / bound >= 0.9, on the GPU"
    out["verdict"] = goal_verdict(run, goals)
    return out


STAGES = [
    ("environment", stage_environment),
    ("parity", stage_parity),
    ("llama1b", stage_llama1b),
    ("roles", stage_roles),
    ("distributions", stage_distributions),
    ("demo_train", stage_demo_train),
    ("demo_bench", stage_demo_bench),
]


def main():
    args = [a for a in sys.argv[1:] if a != "--quick"]
    if len(args) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    bundle, report_path, device = args
    # A run stopped from outside (the shell's timeout) still writes its report and stops
    # what it started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run = Run(os.path.abspath(bundle), report_path, device, "--quick" in sys.argv[1:])
    # The quick dry run on a CPU is slower per stage than the GPU run is: give it room.
    scale = 3.0 if run.quick and not run.on_gpu else 1.0
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
            except StageSkipped as e:
                entry["error"] = str(e)
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
        run.report["summary"] = {
            name: {"status": e["status"], "verdict": (e.get("result") or {}).get("verdict")
                   if isinstance(e.get("result"), dict) else None}
            for name, e in stages.items()
        }
        run.report["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run.write()
        shutil.rmtree(run.work, ignore_errors=True)
    return 0 if all(e["status"] == "ok" for e in run.report["stages"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
