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
