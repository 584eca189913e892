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
  structured --base URL --model NAME
      a model whose byte-level tokenizer can write JSON, with a chat template in the Hermes
      tool-call format: response_format json_schema and chat.completions.parse with a Pydantic
      model give outputs valid under the schema whenever they end with `stop`; tool_choice
      required and named give calls of offered functions whose arguments satisfy their schemas,
      auto gives a well-formed answer, streamed calls assembled from their deltas equal the
      unary ones, a conversation carries calls and results back; and the errors (an invalid
      schema, an unknown tool, two constraints, malformed tools) are 400s naming the field.

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
parser.add_argument("check", choices=["basics", "guarded", "unavailable", "structured"])
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
    # Tools are offered to the template (Qwen2.5's); the output is free, and well-formed.
    offered = client.chat.completions.create(model=args.model, messages=messages, max_completion_tokens=10, seed=3,
                                             tools=[{"type": "function", "function": {"name": "f"}}], extra_body=FIXED)
    assert offered.usage.prompt_tokens > whole.usage.prompt_tokens, (offered.usage, whole.usage)
    assert offered.choices[0].finish_reason in ("stop", "length", "tool_calls"), offered.choices[0]
    expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
        model=args.model, messages=messages, functions=[{"name": "f"}]), param="functions")
    ok("chat with tools renders them into the prompt; the legacy functions: 400 naming it")


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


def satisfies(schema, text):
    """The JSON text, parsed and checked against the schema."""
    import jsonschema

    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "color": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "color"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": WEATHER, "strict": True}},
    {"type": "function", "function": {"name": "now", "description": "The time."}},
]
SCHEMAS = {"get_weather": WEATHER, "now": {"type": "object", "additionalProperties": False}}


def chat(**kw):
    kw.setdefault("messages", [{"role": "user", "content": "What is the weather in Paris?"}])
    kw.setdefault("max_completion_tokens", 96)
    kw.setdefault("extra_body", FIXED)
    return client.chat.completions.create(model=args.model, **kw)


def check_calls(calls):
    """Every call is an offered function's, with an id and arguments valid under its schema."""
    assert calls, "no calls"
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_") and len(call.id) > 5, call
        assert call.function.name in SCHEMAS, call
        satisfies(SCHEMAS[call.function.name], call.function.arguments)
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def assembled(chunks):
    """A stream's text, calls (by index: id, name, arguments) and finish reason."""
    text, calls, finish = "", {}, None
    for chunk in chunks:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": None, "name": "", "arguments": ""})
            if delta.id:
                assert call["id"] is None, ("a second id for one call", delta)
                call["id"] = delta.id
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
        if choice.finish_reason is not None:
            assert finish is None, "two finish reasons"
            finish = choice.finish_reason
    assert sorted(calls) == list(range(len(calls))), calls
    return text, [calls[i] for i in range(len(calls))], finish


def structured():
    # response_format json_schema: whatever ends with `stop` is valid under the schema.
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    finishes = []
    for seed in range(6):
        reply = chat(response_format=fmt, seed=seed, temperature=1.0, max_completion_tokens=64)
        choice = reply.choices[0]
        finishes.append(choice.finish_reason)
        if choice.finish_reason == "stop":
            satisfies(PERSON, choice.message.content)
    assert "stop" in finishes, finishes
    ok(f"response_format json_schema: every output that stops is valid ({finishes})")

    from typing import Literal

    import pydantic

    class Pick(pydantic.BaseModel):
        color: Literal["red", "green", "blue"]
        ok: bool
        size: int = pydantic.Field(ge=0, le=99)

    parsed = client.chat.completions.parse(
        model=args.model, messages=[{"role": "user", "content": "Pick a color."}], response_format=Pick,
        max_completion_tokens=64, seed=1, extra_body=FIXED)
    choice = parsed.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(choice.message.parsed, Pick), choice.message
    assert Pick.model_validate_json(choice.message.content) == choice.message.parsed
    ok(f"chat.completions.parse with a Pydantic model: {choice.message.parsed!r}")

    # tool_choice required, one call: the output is that call.
    for seed in range(3):
        reply = chat(tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=seed, temperature=1.0)
        choice = reply.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1, choice.message
        check_calls(choice.message.tool_calls)
    ok(f"tool_choice required: one call, valid arguments ({choice.message.tool_calls[0].function})")

    # Parallel calls allowed: every call valid where the model ended them.
    reply = chat(tools=TOOLS, tool_choice="required", seed=4, temperature=1.0, max_completion_tokens=160)
    choice = reply.choices[0]
    if choice.finish_reason == "tool_calls":
        check_calls(choice.message.tool_calls)
    else:
        assert choice.finish_reason == "length", choice
    ok(f"tool_choice required with parallel calls: {choice.finish_reason}, "
       f"{len(choice.message.tool_calls or [])} calls")

    named = {"type": "function", "function": {"name": "get_weather"}}
    called = chat(tools=TOOLS, tool_choice=named, seed=5, temperature=1.0)
    choice = called.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1, choice
    [(name, arguments)] = check_calls(choice.message.tool_calls)
    assert name == "get_weather", name
    ok(f"a named tool_choice calls that function: {arguments}")

    # Streaming: the calls assembled from their deltas equal the unary ones of the same seed.
    for kw in (dict(tool_choice=named, seed=5), dict(tool_choice="required", seed=4, max_completion_tokens=160),
               dict(seed=6)):
        unary = chat(tools=TOOLS, temperature=1.0, **kw).choices[0]
        text, calls, finish = assembled(chat(tools=TOOLS, temperature=1.0, stream=True, **kw))
        assert finish == unary.finish_reason, (finish, unary.finish_reason)
        want = [(c.function.name, c.function.arguments) for c in unary.message.tool_calls or []]
        assert [(c["name"], c["arguments"]) for c in calls] == want, (calls, want)
        assert all(c["id"] and c["id"].startswith("call_") for c in calls), calls
        assert text == (unary.message.content or ""), (text, unary.message.content)
    ok("streamed tool calls, assembled from their deltas, equal the unary ones")

    # auto: the output is free; whatever it is, the answer is well-formed.
    for seed in range(3):
        choice = chat(tools=TOOLS, seed=seed, temperature=1.0, max_completion_tokens=24).choices[0]
        assert choice.finish_reason in ("stop", "length", "tool_calls"), choice
        if choice.finish_reason == "tool_calls":
            check_calls(choice.message.tool_calls)
        else:
            assert isinstance(choice.message.content, str), choice.message
    ok("tool_choice auto: a well-formed answer")

    # The call and its result go back to the model in the next turn.
    call = called.choices[0].message.tool_calls[0]
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": "21 C"}]
    after = chat(messages=history, tools=TOOLS, seed=1, max_completion_tokens=8)
    assert after.usage.prompt_tokens > called.usage.prompt_tokens, (after.usage, called.usage)
    ok("a conversation carries the call and its result back")

    def bad(param, message, **kw):
        body = expect_error(openai.BadRequestError, 400, lambda: chat(**kw), param=param)
        assert message in body["message"], body
        return body

    broken = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "minProperties": "two"}}}
    body = bad("response_format", "response_format: invalid constraint", response_format=broken)
    ok(f"an invalid schema: 400 naming it ({body['message'][:100]!r})")
    bad_tool = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "two"}}}]
    body = bad("tools", "tools: invalid constraint", tools=bad_tool, tool_choice="required")
    ok(f"an invalid parameters schema with a required call: 400 naming tools ({body['message'][:100]!r})")
    bad("tool_choice", "not in tools", tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    bad("tool_choice", "response_format", tools=TOOLS, tool_choice="required", response_format=fmt)
    bad("guided_regex", "response_format and guided_regex", response_format=fmt, extra_body={"guided_regex": "a+"})
    bad("tools", "must be unique", tools=TOOLS + TOOLS[:1])
    bad("tools", "must describe an object",
        tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}])
    ok("400s naming the field: unknown tool, two constraints, duplicate tools, parameters not an object")


{"basics": basics, "guarded": guarded, "unavailable": unavailable, "structured": structured}[args.check]()
