#!/usr/bin/env python3
"""specd's OpenAI-compatible HTTP API as the official `openai` client sees it.

Usage: openai_client.py CHECK FLAGS...  (run by specd/tests/openai_api.rs)

Checks against one server:
  basics --base URL --model NAME [--chat] [--greedy-default]
      completions and chat, streaming with and without include_usage, the same text twice
      for a fixed seed and gamma, stop strings, the error shapes of 400 and 404, and the
      model's generation defaults.
  guarded --base URL --model NAME --token T --metrics URL
      a server started with --api-token T, --max-generations 1 and slowed passes: 401 for a
      wrong token, 429 while a generation is in flight, and a client that disconnects from a
      stream, or gives up on a unary request, frees the nodes' sessions within a second;
      504 when a deadline sent as `grpc-timeout` passes.
  unavailable --base URL --model NAME
      a coordinator whose only target is gone: 503.

Every check asserts; the script prints one `ok: ...` line per check and exits non-zero on the
first failure.
"""

import argparse
import json
import re
import threading
import time
import urllib.request

import openai

parser = argparse.ArgumentParser()
parser.add_argument("check", choices=["basics", "guarded", "unavailable"])
parser.add_argument("--base", required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--token", default="unused")
parser.add_argument("--metrics")
parser.add_argument("--chat", action="store_true", help="the model has a chat template")
parser.add_argument("--grpc", help="the coordinator's gRPC address, for NextTokenLaw")
parser.add_argument("--greedy-default", action="store_true",
                    help="the model's generation_config.json says do_sample: false")
args = parser.parse_args()

# Retries would hide the statuses under test.
client = openai.OpenAI(base_url=args.base, api_key=args.token, max_retries=0, timeout=60)
FIXED = {"speculation": {"gamma": 3}}


def ok(what):
    print(f"ok: {what}", flush=True)


def expect_error(kind, status, call, param=None, code=None):
    try:
        call()
    except kind as err:
        assert err.status_code == status, (err.status_code, err)
        body = err.body if isinstance(err.body, dict) else {}
        # The SDK hands over the `error` object of OpenAI's shape.
        assert "message" in body and "type" in body, body
        if param is not None:
            assert body.get("param") == param, body
        if code is not None:
            assert body.get("code") == code, body
        return body
    raise AssertionError(f"expected {kind.__name__} ({status})")


def complete(**kw):
    return client.completions.create(model=args.model, **kw)


def basics():
    prompt = "the quick brown fox"
    whole = complete(prompt=prompt, max_tokens=12, seed=7, temperature=1.0, extra_body=FIXED)
    choice = whole.choices[0]
    assert whole.object == "text_completion" and whole.model == args.model, whole
    assert choice.finish_reason in ("length", "stop"), choice
    assert whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens >= 1, whole.usage
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    specd = whole.model_extra["specd"]
    assert specd["rounds"] >= 1 and specd["draft_tokens"] >= 3, specd
    ok(f"completion: {choice.text!r} ({whole.usage.completion_tokens} tokens, {specd['rounds']} rounds)")

    again = complete(prompt=prompt, max_tokens=12, seed=7, temperature=1.0, extra_body=FIXED)
    assert again.choices[0].text == choice.text, (again.choices[0].text, choice.text)
    ok("a fixed seed with a fixed gamma gives the same text twice")

    other = [complete(prompt=prompt, max_tokens=12, seed=s, temperature=1.0, extra_body=FIXED).choices[0].text
             for s in (8, 9, 10)]
    assert any(t != choice.text for t in other), "the seed changes nothing: is it passed on?"
    ok("other seeds give other texts")

    chunks = list(complete(prompt=prompt, max_tokens=12, seed=7, temperature=1.0, stream=True, extra_body=FIXED))
    assert chunks, "no chunks"
    assert all(c.usage is None for c in chunks), "usage chunk without include_usage"
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1]), "finish reason before the end"
    assert chunks[-1].choices[0].finish_reason == choice.finish_reason, chunks[-1]
    streamed = "".join(c.choices[0].text for c in chunks)
    assert streamed == choice.text, (streamed, choice.text)
    ok(f"streaming: {len(chunks)} chunks whose text is the unary text")

    chunks = list(complete(prompt=prompt, max_tokens=12, seed=7, temperature=1.0, stream=True,
                           stream_options={"include_usage": True}, extra_body=FIXED))
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None, last
    assert last.usage.completion_tokens == whole.usage.completion_tokens, (last.usage, whole.usage)
    assert all(c.usage is None for c in chunks[:-1])
    ok("include_usage adds one last chunk with the usage and no choices")

    # A stop string taken from the text itself: the output ends right before its first place.
    text = choice.text
    stop = next((text[i:i + 2] for i in range(1, len(text) - 1) if text[i:i + 2].strip()), None)
    assert stop is not None, text
    stopped = complete(prompt=prompt, max_tokens=12, seed=7, temperature=1.0, stop=[stop], extra_body=FIXED)
    assert stopped.choices[0].text == text[:text.index(stop)], (stopped.choices[0].text, text, stop)
    assert stopped.choices[0].finish_reason == "stop", stopped.choices[0]
    ok(f"stop {stop!r}: {stopped.choices[0].text!r}")

    ids = complete(prompt=[1, 17, 5], max_tokens=4, temperature=0)
    assert ids.usage.prompt_tokens == 3, ids.usage
    ok("a prompt of token ids")

    # The prefix cache: a 40-token prompt sent again under the same cache_salt finds all of it
    # but its last token (which is always fed); under another salt, nothing. A salt of its own
    # keeps earlier checks' entries out of it.
    long_ids = [3 + (i * 7) % 90 for i in range(40)]
    salt = f"openai-check-{time.time_ns()}"
    cached = []
    for s in (salt, salt, salt + "-other"):
        reply = complete(prompt=long_ids, max_tokens=4, temperature=0, extra_body={"cache_salt": s})
        cached.append((reply.choices[0].text, reply.usage.prompt_tokens_details.cached_tokens))
    assert [c for _, c in cached] == [0, 39, 0], cached
    assert len({t for t, _ in cached}) == 1, cached
    ok(f"usage.prompt_tokens_details.cached_tokens: {[c for _, c in cached]} (cache_salt keeps tenants apart)")

    expect_error(openai.NotFoundError, 404, lambda: client.completions.create(model="no-such-model", prompt="x"),
                 param="model", code="model_not_found")
    ok("404 for another model, in OpenAI's shape")
    expect_error(openai.BadRequestError, 400, lambda: complete(prompt="x", echo=True), param="echo",
                 code="unsupported_parameter")
    expect_error(openai.BadRequestError, 400, lambda: complete(prompt="x", n=2), param="n")
    expect_error(openai.BadRequestError, 400, lambda: complete(prompt="x", temperature=-1))
    expect_error(openai.BadRequestError, 400, lambda: complete(prompt="x", extra_body={"frobnicate": 1}),
                 param="frobnicate")
    ok("400 for what specd cannot honour, for n > 1, for bad values and unknown fields")

    if args.greedy_default:
        greedy = complete(prompt=prompt, max_tokens=8, temperature=0).choices[0].text
        unset = {complete(prompt=prompt, max_tokens=8, seed=s).choices[0].text for s in (1, 2, 3)}
        assert unset == {greedy}, (unset, greedy)
        ok("a request without temperature takes the model's generation_config.json (greedy)")

    if args.grpc:
        logprob_checks()

    models = client.models.list()
    assert [m.id for m in models.data] == [args.model], models
    ok("/v1/models lists the served model")

    if args.chat:
        chat_checks()
    else:
        expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=args.model, messages=[{"role": "user", "content": "hi"}]))
        ok("chat without a chat template: 400")


def chat_checks():
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "the quick brown"}]
    whole = client.chat.completions.create(model=args.model, messages=messages, max_completion_tokens=10, seed=3,
                                           extra_body=FIXED)
    message = whole.choices[0].message
    assert whole.object == "chat.completion" and message.role == "assistant", whole
    assert whole.usage.completion_tokens >= 1
    ok(f"chat: {message.content!r}")
    chunks = list(client.chat.completions.create(model=args.model, messages=messages, max_completion_tokens=10,
                                                 seed=3, stream=True, stream_options={"include_usage": True},
                                                 extra_body=FIXED))
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == message.content, (streamed, message.content)
    ok(f"chat streaming: {len(chunks)} chunks, role first, usage last, the unary text")
    expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=args.model, messages=messages, tools=[{"type": "function", "function": {"name": "f"}}]), param="tools")
    ok("chat with tools: 400 naming tools")


def logprob_checks():
    """Each token's log-probability is the target's processed law at its position, as the
    gRPC NextTokenLaw gives it, whichever branch of the rule emitted the token."""
    import math
    import os
    import sys
    import tempfile

    import grpc

    sys.path.insert(0, os.path.dirname(__file__))
    import python_client

    pb, pb_grpc = python_client.stubs(os.path.join(os.path.dirname(__file__), "..", "proto"), tempfile.mkdtemp())
    stub = pb_grpc.GenerationStub(grpc.insecure_channel(args.grpc))
    prompt = [1, 17, 5]
    settings = dict(temperature=0.8, top_p=0.95)
    extra = {**FIXED, "top_k": 12}
    checked = 0
    for seed in (5, 6, 7):
        r = complete(prompt=prompt, max_tokens=10, seed=seed, logprobs=3, extra_body=extra, **settings)
        ids = r.model_extra["specd"]["token_ids"]
        lp = r.choices[0].logprobs
        assert len(lp.token_logprobs) == len(ids) == len(lp.top_logprobs), (lp, ids)
        for j, token in enumerate(ids):
            law = stub.NextTokenLaw(pb.NextTokenLawRequest(
                prompt_token_ids=prompt, generated_token_ids=ids[:j],
                sampling=pb.SamplingParams(top_k=12, **settings)))
            p = dict(zip(law.token_ids, law.probs))
            assert abs(lp.token_logprobs[j] - math.log(p[token])) < 1e-4, (j, lp.token_logprobs[j], p.get(token))
            best = sorted(p.values(), reverse=True)[:3]
            got = sorted(lp.top_logprobs[j].values(), reverse=True)
            assert abs(got[0] - math.log(best[0])) < 1e-4, (got, best)
            # Two ids may share a text, and so a key: every value shown is one of the law's top 3.
            assert all(any(abs(v - math.log(b)) < 1e-4 for b in best) for v in got), (got, best)
            checked += 1
        streamed = complete(prompt=prompt, max_tokens=10, seed=seed, logprobs=3, stream=True, extra_body=extra,
                            **settings)
        flat = [v for c in streamed if c.choices and c.choices[0].logprobs for v in c.choices[0].logprobs.token_logprobs]
        assert flat == lp.token_logprobs, (flat, lp.token_logprobs)
    ok(f"logprobs equal NextTokenLaw's at all {checked} positions; streamed ones equal the unary ones")
    if args.chat:
        chat = client.chat.completions.create(model=args.model, messages=[{"role": "user", "content": "fox"}],
                                              max_completion_tokens=4, logprobs=True, top_logprobs=2,
                                              temperature=1.0, seed=1)
        content = chat.choices[0].logprobs.content
        assert len(content) == chat.usage.completion_tokens, chat
        assert all(len(c.top_logprobs) <= 2 and c.logprob <= 0 and c.bytes is not None for c in content), content
        ok("chat logprobs in OpenAI's shape")


def active_sessions():
    """Sessions open on the nodes, from the server's /metrics."""
    text = urllib.request.urlopen(args.metrics, timeout=5).read().decode()
    found = re.findall(r'^specd_active_sessions\{role="(target|draft)"\} (\d+)', text, re.M)
    assert found, text
    return sum(int(n) for _, n in found)


def guarded():
    wrong = openai.OpenAI(base_url=args.base, api_key="not-" + args.token, max_retries=0)
    expect_error(openai.AuthenticationError, 401, lambda: wrong.completions.create(model=args.model, prompt="x"))
    expect_error(openai.AuthenticationError, 401, lambda: wrong.models.list())
    ok("401 for a wrong bearer token, on generation and /v1/models")

    long = dict(prompt=[1, 17, 5], max_tokens=40, temperature=1.0, seed=1, extra_body={"ignore_eos": True})
    stream = complete(stream=True, **long)
    first = next(iter(stream))
    assert first.choices, first
    busy = expect_error(openai.RateLimitError, 429, lambda: complete(**long))
    ok(f"429 while the one allowed generation runs: {busy['message']!r}")
    assert active_sessions() >= 1, "the streaming generation holds no node session"
    stream.close()  # the client goes away mid-stream
    gone = time.monotonic()
    while active_sessions() > 0:
        assert time.monotonic() - gone < 1.0, "node sessions still open 1 s after the client left"
        time.sleep(0.02)
    ok(f"a client that leaves a stream frees the nodes' sessions in {time.monotonic() - gone:.3f} s")
    # A unary request whose client gives up (its timeout) goes the same way.
    try:
        client.with_options(timeout=0.5).completions.create(model=args.model, **long)
        raise AssertionError("the long request finished within its 0.5 s timeout: nothing was tested")
    except openai.APITimeoutError:
        pass
    gone = time.monotonic()
    while active_sessions() > 0:
        assert time.monotonic() - gone < 1.0, "node sessions still open 1 s after the client timed out"
        time.sleep(0.02)
    ok(f"a unary client that times out frees the nodes' sessions in {time.monotonic() - gone:.3f} s")
    # A deadline sent as gRPC's header ends the generation with a 504 in OpenAI's shape.
    late = expect_error(openai.InternalServerError, 504,
                        lambda: complete(**long, extra_headers={"grpc-timeout": "300m"}))
    assert late["type"] == "timeout_error", late
    ok(f"504 when the request's deadline (grpc-timeout) passes: {late['message']!r}")
    # And the server takes the next request at once.
    after = complete(**{**long, "max_tokens": 2})
    assert after.usage.completion_tokens == 2, after.usage
    ok("the next request is served")


def unavailable():
    """The coordinator's only target is gone: 503 in OpenAI's shape, and /health says so."""
    gone = expect_error(openai.InternalServerError, 503, lambda: complete(prompt=[1, 2], max_tokens=2))
    assert gone["type"] == "service_unavailable_error", gone
    ok(f"503 when the target is gone: {gone['message']!r}")


{"basics": basics, "guarded": guarded, "unavailable": unavailable}[args.check]()
