"""A third-party client: Anthropic's official `anthropic` package against
`revis serve`'s /v1/messages, unchanged but for its base URL and key (sent
as `x-api-key`, as the package does).

Usage: python3 anthropic_client.py BASE_URL API_KEY MODEL
Prints one JSON object with what it saw; exits non-zero on any failure.
Nothing here depends on the model's words.
"""
import json
import sys

import anthropic

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Greedy, so streamed and whole answers can be compared. The package's own
# arguments no longer include temperature; revis's Messages API still
# reads it, sent as an extra field.
GREEDY = {"temperature": 0}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}}, "required": ["city"], "additionalProperties": False},
}


def usage(u) -> dict:
    """Anthropic's usage: the prompt is input + cache_read (+ cache_creation)."""
    return {
        "input_tokens": u.input_tokens,
        "cache_read_input_tokens": u.cache_read_input_tokens or 0,
        "prompt": u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0),
        "output_tokens": u.output_tokens,
    }


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0, timeout=120)
    out = {}

    r = client.messages.create(model=model, max_tokens=24, extra_body=GREEDY, system="Be brief.", messages=QUESTION)
    out["create"] = {
        "type": r.type,
        "role": r.role,
        "blocks": [b.type for b in r.content],
        "text": "".join(b.text for b in r.content if b.type == "text"),
        "stop_reason": r.stop_reason,
        "usage": usage(r.usage),
    }

    with client.messages.stream(model=model, max_tokens=24, extra_body=GREEDY, system="Be brief.", messages=QUESTION) as s:
        events = []
        started = None
        for e in s:
            events.append(e.type)
            if e.type == "message_start":
                started = usage(e.message.usage)
        final = s.get_final_message()
    out["stream"] = {
        "events": events,
        "text": "".join(b.text for b in final.content if b.type == "text"),
        "stop_reason": final.stop_reason,
        "started": started,
        "usage": usage(final.usage),
    }

    out["count"] = client.messages.count_tokens(model=model, system="Be brief.", messages=QUESTION).input_tokens

    # A tool_use round trip: the call, its result, the answer.
    asked = [{"role": "user", "content": "What is the weather in Paris?"}]
    r = client.messages.create(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}, messages=asked)
    uses = [b for b in r.content if b.type == "tool_use"]
    out["tool_use"] = {
        "stop_reason": r.stop_reason,
        "calls": [{"id": u.id, "name": u.name, "input": u.input} for u in uses],
    }
    with client.messages.stream(model=model, max_tokens=64, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True}, messages=asked) as s:
        streamed = s.get_final_message()
    out["tool_use_streamed"] = [{"name": b.name, "input": b.input} for b in streamed.content if b.type == "tool_use"]
    u = uses[0]
    history = asked + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": u.id, "name": u.name, "input": u.input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": u.id, "content": json.dumps({"temperature": 18})}]},
    ]
    r = client.messages.create(model=model, max_tokens=32, extra_body=GREEDY, tools=[WEATHER], tool_choice={"type": "none"}, messages=history)
    out["answer"] = {"stop_reason": r.stop_reason, "blocks": [b.type for b in r.content], "has_text": any(b.type == "text" and b.text for b in r.content)}

    try:
        client.messages.create(model="no-such-model", max_tokens=5, messages=QUESTION)
        out["unknown_model"] = None
    except anthropic.NotFoundError as e:
        out["unknown_model"] = {"status": e.status_code, "type": e.body["error"]["type"] if isinstance(e.body, dict) else None}
    try:
        anthropic.Anthropic(base_url=base, api_key="wrong", max_retries=0).messages.create(model=model, max_tokens=5, messages=QUESTION)
        out["wrong_key"] = None
    except anthropic.AuthenticationError as e:
        out["wrong_key"] = {"status": e.status_code}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
