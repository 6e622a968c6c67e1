"""A third-party client: Ollama's official `ollama` package against
`revis serve`'s /api, unchanged but for its host and the key header.

Usage: python3 ollama_client.py BASE_URL API_KEY MODEL
Prints one JSON object with what it asked and saw; exits non-zero on any failure.
"""
import json
import sys

import ollama


# Greedy: the test asks revisd the same through its own client and compares.
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = ollama.Client(host=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    out = {"question": QUESTION, "max_tokens": MAX_TOKENS}

    out["tags"] = [m.model for m in client.list().models]

    parts = list(
        client.chat(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            stream=True,
            options={"temperature": 0, "num_predict": MAX_TOKENS},
        )
    )
    last = parts[-1]
    out["chat"] = {
        "parts": len(parts),
        "text": "".join(p.message.content for p in parts),
        "done": [p.done for p in parts],
        "done_reason": last.done_reason,
        "eval_count": last.eval_count,
        "prompt_eval_count": last.prompt_eval_count,
        "total_duration": last.total_duration,
        "eval_duration": last.eval_duration,
    }

    r = client.generate(model=model, prompt=QUESTION, stream=False, options={"temperature": 0, "num_predict": MAX_TOKENS})
    out["generate"] = {"text": r.response, "done": r.done, "done_reason": r.done_reason, "eval_count": r.eval_count}

    r = client.chat(
        model=model,
        messages=[{"role": "user", "content": "Describe Paris as JSON."}],
        format={"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
        options={"temperature": 0, "num_predict": 48},
    )
    out["json"] = json.loads(r.message.content)

    # Functions: the model chooses (Ollama has no tool_choice). Any call it
    # makes names a function offered, with arguments as an object; its
    # result goes back as a tool message and the answer is well formed.
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
    asked = [{"role": "user", "content": "What is the weather in Paris? Use the get_weather function."}]
    r = client.chat(model=model, messages=asked, tools=[weather], options={"temperature": 0, "num_predict": 64})
    calls = r.message.tool_calls or []
    out["tools"] = {
        "done_reason": r.done_reason,
        "calls": [{"name": c.function.name, "arguments": dict(c.function.arguments)} for c in calls],
        "content": r.message.content,
    }
    call = calls[0] if calls else ollama.Message.ToolCall(function=ollama.Message.ToolCall.Function(name="get_weather", arguments={"city": "Paris"}))
    history = asked + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": json.dumps({"temperature": 18}), "tool_name": "get_weather"},
    ]
    r = client.chat(model=model, messages=history, tools=[weather], options={"temperature": 0, "num_predict": 32})
    out["tools_answer"] = {
        "done": r.done,
        "well_formed": bool(r.message.content) or bool(r.message.tool_calls),
        "calls": [c.function.name for c in r.message.tool_calls or []],
    }

    r = client.embed(model=model, input=["The cat sat on the mat.", "Quarterly tax filings are due in April."])
    out["embed"] = {"vectors": r.embeddings, "prompt_eval_count": r.prompt_eval_count}

    try:
        client.generate(model="no-such-model", prompt="hi")
        out["unknown_model"] = "no error"
    except ollama.ResponseError as e:
        out["unknown_model"] = {"status": e.status_code, "error": e.error}

    try:
        ollama.Client(host=base).list()
        out["no_key"] = "no error"
    except ollama.ResponseError as e:
        out["no_key"] = {"status": e.status_code, "error": e.error}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
