"""A third-party client: OpenAI's official `openai` package against `revis
serve`'s Responses API, log-probabilities, several choices and penalties,
unchanged but for its base URL and key.

Usage: python3 openai_more.py BASE_URL API_KEY MODEL
Prints one JSON object with what it saw; exits non-zero on any failure.
Nothing here depends on the model's words.
"""
import json
import math
import sys

import openai

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"], "additionalProperties": False},
}


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    out = {}

    # Responses: plain, streamed, and a function call round trip.
    r = client.responses.create(model=model, instructions="Be brief.", input="What is the capital of France?", temperature=0, max_output_tokens=24)
    out["responses"] = {"status": r.status, "text": r.output_text, "types": [o.type for o in r.output], "usage": r.usage.output_tokens}
    events = []
    with client.responses.stream(model=model, instructions="Be brief.", input="What is the capital of France?", temperature=0, max_output_tokens=24) as s:
        for e in s:
            events.append(e.type)
        final = s.get_final_response()
    out["responses_stream"] = {"events": events, "text": final.output_text, "status": final.status}
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.responses.create(model=model, input=asked, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False, temperature=0, max_output_tokens=64)
    calls = [o for o in r.output if o.type == "function_call"]
    out["responses_call"] = {"calls": [{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls]}
    c = calls[0]
    followed = asked + [
        {"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments},
        {"type": "function_call_output", "call_id": c.call_id, "output": json.dumps({"temperature": 18})},
    ]
    r = client.responses.create(model=model, input=followed, tools=[WEATHER], tool_choice="none", temperature=0, max_output_tokens=32)
    out["responses_answer"] = {"types": [o.type for o in r.output], "has_text": bool(r.output_text)}
    try:
        client.responses.create(model=model, input="x", previous_response_id="resp_123")
        out["stateless"] = None
    except openai.BadRequestError as e:
        out["stateless"] = {"status": e.status_code, "param": e.body.get("param") if isinstance(e.body, dict) else None}

    # Log-probabilities, whole and streamed.
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    out["logprobs"] = {
        "text": r.choices[0].message.content,
        "tokens": bytes(b for t in content for b in t.bytes).decode(),
        "count": len(content),
        "valid": all(t.logprob <= 0 and math.isfinite(t.logprob) for t in content),
        "tops": [len(t.top_logprobs) for t in content],
        "greedy_is_top": all(t.top_logprobs and t.top_logprobs[0].logprob <= t.logprob + 1e-4 for t in content),
    }
    streamed = []
    for chunk in client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=12, logprobs=True, stream=True):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(b for t in chunk.choices[0].logprobs.content for b in t.bytes)
    out["logprobs_streamed"] = bytes(streamed).decode()
    r = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=8, logprobs=2)
    lp = r.choices[0].logprobs
    out["completion_logprobs"] = {"text": r.choices[0].text, "tokens": "".join(lp.tokens), "count": len(lp.token_logprobs)}

    # Several choices: sampled with a seed, each its own; greedy, all the same.
    r = client.chat.completions.create(model=model, messages=QUESTION, n=3, temperature=1.0, seed=5, max_tokens=16)
    out["n"] = {"indices": [c.index for c in r.choices], "texts": [c.message.content for c in r.choices], "completion_tokens": r.usage.completion_tokens}
    r = client.chat.completions.create(model=model, messages=QUESTION, n=2, temperature=0, max_tokens=16)
    out["n_greedy"] = [c.message.content for c in r.choices]
    by_index = {}
    for chunk in client.chat.completions.create(model=model, messages=QUESTION, n=2, temperature=0, max_tokens=16, stream=True):
        for c in chunk.choices:
            by_index[c.index] = by_index.get(c.index, "") + (c.delta.content or "")
    out["n_streamed"] = [by_index.get(0), by_index.get(1)]

    # Penalties: any value in range is answered; out of range is refused naming it.
    r = client.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=16, presence_penalty=1.5, frequency_penalty=0.5)
    out["penalties"] = {"finish_reason": r.choices[0].finish_reason, "has_text": bool(r.choices[0].message.content)}
    try:
        client.chat.completions.create(model=model, messages=QUESTION, presence_penalty=3)
        out["penalty_range"] = None
    except openai.BadRequestError as e:
        out["penalty_range"] = {"status": e.status_code, "param": e.body.get("param") if isinstance(e.body, dict) else None}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
