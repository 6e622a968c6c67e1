"""A third-party client: OpenAI's official `openai` package against
`revis serve`'s /v1, unchanged but for its base URL and key.

Usage: python3 openai_client.py BASE_URL API_KEY MODEL
Prints one JSON object with what it asked and saw; exits non-zero on any failure.
"""
import json
import sys

import openai


# Greedy: the test asks revisd the same through its own client and compares.
QUESTION = "What is the capital of France?"
MAX_TOKENS = 24


def main() -> None:
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=120)
    out = {"question": QUESTION, "max_tokens": MAX_TOKENS}

    out["models"] = [m.id for m in client.models.list().data]

    question = [{"role": "user", "content": QUESTION}]
    r = client.chat.completions.create(model=model, messages=question, temperature=0, max_tokens=MAX_TOKENS)
    out["chat"] = {
        "text": r.choices[0].message.content,
        "role": r.choices[0].message.role,
        "finish_reason": r.choices[0].finish_reason,
        "usage": r.usage.model_dump(exclude_none=True),
        "object": r.object,
    }

    chunks = list(
        client.chat.completions.create(
            model=model, messages=question, temperature=0, max_completion_tokens=MAX_TOKENS, stream=True, stream_options={"include_usage": True}
        )
    )
    with_choices = [c for c in chunks if c.choices]
    out["stream"] = {
        "chunks": len(chunks),
        "first_role": with_choices[0].choices[0].delta.role,
        "text": "".join(c.choices[0].delta.content or "" for c in with_choices),
        "finish_reason": with_choices[-1].choices[0].finish_reason,
        "finish_reasons": [c.choices[0].finish_reason for c in with_choices],
        "usage": chunks[-1].usage.model_dump(exclude_none=True) if chunks[-1].usage else None,
        "usage_chunk_choices": len(chunks[-1].choices),
        "ids": len({c.id for c in chunks}),
    }

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
        "additionalProperties": False,
    }
    r = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Name a large city and its population as JSON."}],
        temperature=0,
        max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}},
    )
    value = json.loads(r.choices[0].message.content)
    # The schema, checked by hand (no jsonschema package needed).
    assert isinstance(value, dict) and set(value) == {"city", "population"}, value
    assert isinstance(value["city"], str) and isinstance(value["population"], int) and not isinstance(value["population"], bool), value
    out["json_schema"] = value

    r = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=16)
    out["completion"] = {"text": r.choices[0].text, "object": r.object, "finish_reason": r.choices[0].finish_reason}

    # The package asks for base64 unless told; both forms are checked.
    texts = ["The cat sat on the mat.", "A cat was sitting on a mat.", "Quarterly tax filings are due in April."]
    r = client.embeddings.create(model=model, input=texts)
    floats = client.embeddings.create(model=model, input=texts[0], encoding_format="float")
    out["embeddings"] = {
        "object": r.object,
        "vectors": [d.embedding for d in r.data],
        "indices": [d.index for d in r.data],
        "usage": r.usage.model_dump(exclude_none=True),
        "float_first": floats.data[0].embedding,
    }

    try:
        client.chat.completions.create(model="no-such-model", messages=question, max_tokens=4)
        out["unknown_model"] = "no error"
    except openai.NotFoundError as e:
        out["unknown_model"] = {"status": e.status_code, "code": e.code, "param": e.param, "type": e.type}

    try:
        openai.OpenAI(base_url=f"{base}/v1", api_key="wrong", max_retries=0).models.list()
        out["wrong_key"] = "no error"
    except openai.AuthenticationError as e:
        out["wrong_key"] = {"status": e.status_code, "code": e.code, "message": e.message}

    print(json.dumps(out))


if __name__ == "__main__":
    main()
