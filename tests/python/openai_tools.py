"""A third-party agent: OpenAI's official `openai` package calling functions
through `revis serve`'s /v1, unchanged but for its base URL and key.

Usage: python3 openai_tools.py BASE_URL API_KEY MODEL
Prints one JSON object with what it saw; exits non-zero on any failure.
Nothing here depends on the model's words: only on the shapes OpenAI's API
promises (a required call is a call, its arguments parse and match the
function's schema, a streamed call adds up to the same call).
"""
import json
import sys

import openai
import pydantic

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 24}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 24}}, "required": ["zone"]},
    },
}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


def keeps_to_schema(name: str, arguments: str) -> bool:
    """The arguments parse as JSON and match the function's schema."""
    args = json.loads(arguments)
    if name == "get_weather":
        return set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("celsius", "fahrenheit")
    if name == "get_time":
        return "zone" in args and isinstance(args["zone"], str)
    return False


class Weather(pydantic.BaseModel):
    # Bounded, so a call always fits max_tokens whatever the model writes.
    city: str = pydantic.Field(max_length=24)
    unit: str = pydantic.Field(max_length=12)


class Place(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)


class Trip(pydantic.BaseModel):
    """A trip between two cities."""

    origin: Place
    destination: Place


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    out = {}

    # A required call, not streamed.
    r = client.chat.completions.create(
        model=model, messages=QUESTION, tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=96
    )
    c = r.choices[0]
    calls = c.message.tool_calls or []
    out["required"] = {
        "finish_reason": c.finish_reason,
        "calls": [{"id": t.id, "type": t.type, "name": t.function.name, "arguments": t.function.arguments} for t in calls],
        "valid": all(keeps_to_schema(t.function.name, t.function.arguments) for t in calls),
        "content": c.message.content,
    }

    # The same, streamed: the deltas add up to the same call.
    name, arguments, ids, finish = "", "", set(), None
    for chunk in client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice="required",
        parallel_tool_calls=False,
        temperature=0,
        max_tokens=96,
        stream=True,
    ):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        for t in d.tool_calls or []:
            if t.id:
                ids.add(t.id)
            if t.function and t.function.name:
                name += t.function.name
            if t.function and t.function.arguments:
                arguments += t.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    out["streamed"] = {"name": name, "arguments": arguments, "ids": len(ids), "finish_reason": finish}

    # One function named: that one is called.
    r = client.chat.completions.create(
        model=model,
        messages=QUESTION,
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        temperature=0,
        max_tokens=96,
    )
    t = r.choices[0].message.tool_calls[0]
    out["named"] = {"name": t.function.name, "valid": keeps_to_schema(t.function.name, t.function.arguments)}

    # The agent loop: the call, its result, the answer (functions not offered).
    call = out["required"]["calls"][0]
    history = QUESTION + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": call["arguments"]}}],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": json.dumps({"temperature": 18, "sky": "clear"})},
    ]
    r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER, TIME], tool_choice="none", temperature=0, max_tokens=32)
    out["answer"] = {"finish_reason": r.choices[0].finish_reason, "has_text": bool(r.choices[0].message.content), "calls": r.choices[0].message.tool_calls}
    # auto: the model chooses; either way the reply is well formed.
    r = client.chat.completions.create(model=model, messages=history, tools=[WEATHER, TIME], temperature=0, max_tokens=48)
    c = r.choices[0]
    out["auto"] = {
        "finish_reason": c.finish_reason,
        "well_formed": (c.finish_reason == "tool_calls" and bool(c.message.tool_calls) and all(keeps_to_schema(t.function.name, t.function.arguments) for t in c.message.tool_calls))
        or (c.finish_reason in ("stop", "length") and not c.message.tool_calls and c.message.content is not None),
    }

    # parse() with a pydantic tool: its arguments come back as the model.
    r = client.chat.completions.parse(
        model=model,
        messages=QUESTION,
        tools=[openai.pydantic_function_tool(Weather, name="weather")],
        tool_choice={"type": "function", "function": {"name": "weather"}},
        temperature=0,
        max_tokens=96,
    )
    parsed = r.choices[0].message.tool_calls[0].function.parsed_arguments
    out["parsed"] = {"type": type(parsed).__name__, "city_is_str": isinstance(parsed.city, str)}

    # Nested models: pydantic writes them as $defs and $ref, as instructor,
    # pydantic-ai and openai-agents send them.
    tool = openai.pydantic_function_tool(Trip, name="trip")
    r = client.chat.completions.parse(
        model=model,
        messages=[{"role": "user", "content": "Plan a trip from Paris to Rome."}],
        tools=[tool],
        tool_choice={"type": "function", "function": {"name": "trip"}},
        temperature=0,
        max_tokens=128,
    )
    trip = r.choices[0].message.tool_calls[0].function.parsed_arguments
    out["nested"] = {
        "sent_refs": "$ref" in json.dumps(tool),
        "type": type(trip).__name__,
        "places": [type(trip.origin).__name__, type(trip.destination).__name__],
    }

    # A call for a function not offered is refused, naming the field.
    try:
        client.chat.completions.create(model=model, messages=QUESTION, tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "nope"}})
        out["unknown_choice"] = None
    except openai.BadRequestError as e:
        out["unknown_choice"] = {"status": e.status_code, "param": e.body.get("param") if isinstance(e.body, dict) else None, "message": str(e)}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
